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


@pytest.mark.parametrize("kind", ["RuntimeError", "SystemExit"])
def test_an_on_commit_callback_that_raises_leaves_the_committed_success_as_it_is(
    caplog, kind
):
    """The action's transaction committed, with its outcome and the claim of the next job
    of its batch; a callback it left for after the commit then raised. The job succeeded:
    it is acked and signalled as such, and the next job runs on the claim that committed."""
    succeeded = []

    def on_succeeded(sender, job, **kwargs):
        succeeded.append(job.pk)

    signals.job_succeeded.connect(on_succeeded)
    try:
        past = timezone.now() - timedelta(seconds=1)
        hooked = build_job(tasks.record_then_hook_raises, at=past, args=["hooked", kind])
        following = build_job(tasks.record, at=past, args=["following"])
        schedule_many([hooked, following])  # one batch: the first claims the second
        burst()
    finally:
        signals.job_succeeded.disconnect(on_succeeded)
    hooked.refresh_from_db()
    assert (hooked.status, hooked.attempts, hooked.deliveries) == (Status.SUCCEEDED, 1, 1)
    assert kinds(hooked) == ["scheduled", "started", "succeeded"]
    following.refresh_from_db()
    assert (following.status, following.deliveries) == (Status.SUCCEEDED, 1)
    assert kinds(following) == ["scheduled", "started", "succeeded"]
    assert succeeded == [hooked.pk, following.pk]
    stats = get_engine().stats("default")
    assert (stats.ready, stats.in_flight, stats.pending) == (0, 0, 0)
    assert "taken over" not in caplog.text
    assert "on-commit callback" in caplog.text


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
