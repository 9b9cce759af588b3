"""Audit (chaos): failing tests for the worker under hostile actions."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from django_delayjobs import schedule, schedule_many, signals
from django_delayjobs.connection import get_engine
from django_delayjobs.models import Job, Status
from django_delayjobs.services import build_job
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True)


def burst() -> None:
    call_command("run_delayworker", "--burst", "-v", "0")


def kinds(job: Job) -> list[str]:
    return list(job.events.order_by("at", "id").values_list("kind", flat=True))


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's session settings")
@pytest.mark.parametrize("prefetch", [1, 10])
@pytest.mark.parametrize(
    "statement",
    [
        "SET DateStyle = 'SQL, DMY'",  # psycopg cannot read timestamps any more
        "SET client_encoding = 'LATIN1'",  # nor text outside Latin-1
        "SET default_transaction_read_only = on",  # and no transaction may write
    ],
)
def test_a_session_setting_an_action_leaves_behind_never_reaches_the_next_job(
    settings, prefetch, statement
):
    """A ``SET`` commits with the action's transaction and stays with its connection. The
    jobs after it (claimed in that transaction, or in the next batch) must run on a session
    as Django opened it: not buried as unreadable rows, not handed back as refused."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "PREFETCH": prefetch}
    past = timezone.now() - timedelta(seconds=1)
    changer = build_job(tasks.change_session, at=past, args=[statement])
    following = [build_job(tasks.record, at=past, args=[f"中文 {n}"]) for n in range(2)]
    schedule_many([changer, *following])
    burst()
    for job in [changer, *following]:
        job.refresh_from_db()
        assert (job.status, job.attempts, job.deliveries) == (Status.SUCCEEDED, 1, 1), (
            job.last_error
        )
    assert sorted(Record.objects.values_list("label", flat=True)) == ["中文 0", "中文 1"]
