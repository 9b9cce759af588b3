"""Audit (chaos): failing tests for the worker under hostile actions."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from django_delayjobs import schedule_many, signals
from django_delayjobs.models import Status
from django_delayjobs.services import build_job
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's session settings")
@pytest.mark.parametrize("prefetch", [1, 10])
@pytest.mark.parametrize("signal_name", ["job_started", "job_succeeded"])
def test_a_session_setting_a_signal_receiver_leaves_behind_never_reaches_the_next_job(
    settings, prefetch, signal_name
):
    """Receivers run in the worker thread, on its connection, as the action does."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "PREFETCH": prefetch}

    def change(sender, job, **kwargs):
        if job.args == ["change"]:
            with connection.cursor() as cursor:
                cursor.execute("SET DateStyle = 'SQL, DMY'")

    getattr(signals, signal_name).connect(change)
    try:
        past = timezone.now() - timedelta(seconds=1)
        jobs = [build_job(tasks.record, at=past, args=[label]) for label in ("change", "a", "b")]
        schedule_many(jobs)
        call_command("run_delayworker", "--burst", "-v", "0")
    finally:
        getattr(signals, signal_name).disconnect(change)
    for job in jobs:
        job.refresh_from_db()
        assert (job.status, job.attempts, job.deliveries) == (Status.SUCCEEDED, 1, 1), (
            job.last_error
        )
