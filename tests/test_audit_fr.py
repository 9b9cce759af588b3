"""Audit of an outcome whose Redis move found its id elsewhere than in flight.

While worker W1 runs a job, Redis loses the id's in-flight entry (data loss, a failover);
the reconcile sweep re-adds it, and worker W2, finding the row running and young, defers
it: its nack puts the id in pending half a lease after W1's start. W1's outcome move then
moves nothing (the id is pending, not in flight). A retry's due time was read back from
the row only to compare it with the nacked one, which matched: Redis kept the deferral's
due time, and the retry ran about half a lease late.
"""

from __future__ import annotations

import logging
from datetime import UTC, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_delayjobs import Retry, delayable, timing
from django_delayjobs.connection import get_engine
from django_delayjobs.execution import HAND_BACK_DELAY, Execution, current_job
from django_delayjobs.models import Job, Status
from django_delayjobs.outcomes import Outcome, Result, settle
from django_delayjobs.services import schedule
from tests.test_audit_guard import burst, half_lease, row, started_by_a
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)
Q = "default"
RETRY_SECONDS = 20.0
#: The jobs whose action saw the race happen as the test means it (an assertion failing in
#: the action would only fail that attempt, which a retry follows all the same).
RACED: list[str] = []


def lose_the_lease(job_id: str) -> Result:
    """Redis loses the running id; the reconcile sweep adds it again, and worker W2 claims
    it in Redis, then in the database, and settles what its claim found."""
    engine = get_engine()
    engine.client.flushdb()
    engine.add(Q, {job_id: 0})  # the reconcile sweep's add
    assert list(engine.claim(Q, 1)) == [job_id]
    result = Execution(Q, job_id, "W2").run()
    settle(engine, Q, job_id, result)
    return result


@delayable(atomic=False)
def lose_the_lease_then_retry(seconds: float) -> None:
    """First attempt: Redis loses the id in flight, the sweep re-adds it and worker W2
    defers it (as its worker does: a claim in Redis, in the database, then its move);
    then the attempt asks to be retried ``seconds`` later."""
    job = current_job.get()
    assert job is not None
    if job.attempts > 1:
        return
    job_id, engine = str(job.pk), get_engine()
    assert lose_the_lease(job_id).outcome == Outcome.DEFERRED  # running since now on W1
    [(_, due)] = engine.next_due(Q, 10)
    assert job.started_at is not None
    assert due >= timing.to_ms(job.started_at + half_lease()) - 1000
    RACED.append(job_id)
    raise Retry("not yet", after=seconds)


def test_a_retry_whose_id_was_deferred_by_another_worker_is_due_at_its_retry_time():
    RACED.clear()
    job = schedule(lose_the_lease_then_retry, in_=0, args=[RETRY_SECONDS])
    burst()  # W1
    assert [str(job.pk)] == RACED
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.RETRYING, 1)
    [(job_id, due)] = get_engine().next_due(Q, 10)
    assert job_id == str(job.pk)
    # Due at the row's retry time, not at the deferral's (W1's start plus half a lease).
    assert abs(due - timing.to_ms(job.run_at)) < 1000
    assert Job.objects.get(pk=job.pk).run_at < timezone.now() + half_lease() / 2


@delayable(atomic=False)
def lose_the_lease_then_die() -> None:
    """As above, then the job's only attempt fails: it is dead."""
    job = current_job.get()
    assert job is not None
    lose_the_lease(str(job.pk))
    raise RuntimeError("failing on purpose")


def test_a_job_dead_whose_id_was_deferred_reaches_garbage_at_the_deferrals_due_time():
    """Left as it is: no engine call moves a pending id to garbage. Its bury moves nothing,
    the id waits in pending (the job list shows the job dead at once), and the claim at
    the deferral's due time finds the row dead and buries the id."""
    job = schedule(lose_the_lease_then_die, in_=0, max_attempts=1)
    burst()  # W1
    job.refresh_from_db()
    engine = get_engine()
    assert job.status == Status.DEAD and engine.garbage(Q, 10) == []
    assert [job_id for job_id, _ in engine.next_due(Q, 10)] == [str(job.pk)]
    assert engine.reschedule(Q, str(job.pk), 0)  # the deferral's due time, come
    burst()
    assert [entry[0] for entry in engine.garbage(Q, 10)] == [str(job.pk)]
    assert engine.next_due(Q, 10) == [] and Job.objects.get(pk=job.pk).status == Status.DEAD


@pytest.mark.parametrize(
    ("column", "said"), [("started_at", "running since"), ("run_at", "scheduled, due at")]
)
def test_a_row_the_claim_and_its_check_disagree_on_is_looked_at_in_a_second(
    settings, caplog, column, said
):
    """SQLite: a start (or due) time written by hand as ISO text ('T' between date and
    time) sorts after the claim's time of the same day (' '), so the claim matches nothing
    (no takeover of the running row, the waiting row not due), while Django reads the
    time as over half a lease ago (as past). Each such deferral was due at once: claim,
    fetch, nack, again, a few ms apart. Now one a second, said."""
    if connection.vendor != "sqlite":
        pytest.skip("a time held as text: SQLite's text comparison")
    settings.DELAYJOBS = {**settings.DELAYJOBS, "LEASE_SECONDS": 1}  # half a lease: 0.5 s
    if column == "started_at":
        job, state = started_by_a(), (Status.RUNNING, 1, 1, "A")
    else:
        job, state = schedule(tasks.record, in_=60, args=["later"]), (Status.SCHEDULED, 0, 0, "")
    at = timezone.now().astimezone(UTC) - timedelta(seconds=3)
    if at.date() != timezone.now().astimezone(UTC).date():  # pragma: no cover
        pytest.skip("just past midnight: the dates' text would agree")
    text = at.replace(tzinfo=None).isoformat(timespec="seconds")  # 'T' separator
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {Job._meta.db_table} SET {column} = %s WHERE id = %s",
                       [text, job.pk.hex])  # fmt: skip
    assert getattr(Job.objects.get(pk=job.pk), column) == at.replace(microsecond=0)
    before = timezone.now()
    with caplog.at_level(logging.INFO, logger="django_delayjobs"):
        result = Execution(Q, str(job.pk), "B").claim()
    assert isinstance(result, Result) and result.outcome == Outcome.DEFERRED
    assert result.retry_at is not None and result.retry_at >= before + HAND_BACK_DELAY
    [record] = [r for r in caplog.records if "not claimed" in r.getMessage()]
    assert record.levelno == logging.INFO and said in record.getMessage()
    assert row(job) == state
