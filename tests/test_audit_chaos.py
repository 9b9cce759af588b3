"""Audit (chaos): failing tests for the worker under hostile actions."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone

from django_delayjobs import schedule_many, signals
from django_delayjobs.models import Status
from django_delayjobs.services import build_job
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("signal_name", ["job_started", "job_succeeded"])
def test_a_receiver_that_leaves_autocommit_off_costs_no_job_its_outcome(signal_name):
    """As for an action: autocommit is turned on again (on SQLite the driver's own
    transaction handling happened to commit anyway; on PostgreSQL nothing did)."""

    def manual(sender, job, **kwargs):
        if job.args == ["first"]:
            transaction.set_autocommit(False)

    getattr(signals, signal_name).connect(manual)
    try:
        past = timezone.now() - timedelta(seconds=1)
        jobs = [build_job(tasks.record, at=past, args=[label]) for label in ("first", "next")]
        schedule_many(jobs)
        call_command("run_delayworker", "--burst", "-v", "0")
    finally:
        getattr(signals, signal_name).disconnect(manual)
    for job in jobs:
        job.refresh_from_db()
        assert (job.status, job.deliveries) == (Status.SUCCEEDED, 1)
    assert sorted(Record.objects.values_list("label", flat=True)) == ["first", "next"]
