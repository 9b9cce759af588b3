"""The hand-written statements of the worker's hot path mean what the ORM calls meant."""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_delayjobs import schedule, sql
from django_delayjobs.models import Job, Status
from tests.testapp import tasks
from tests.testapp.models import Thing

pytestmark = pytest.mark.django_db(transaction=True)


def fields(job: Job) -> dict[str, object]:
    return {f.attname: getattr(job, f.attname) for f in Job._meta.concrete_fields}


def test_fetch_reads_the_row_exactly_as_the_orm_does():
    thing = Thing.objects.create()
    job = schedule(thing.expire, in_=60, kwargs={"reason": Decimal("1.5")}, key="k", expires=3600)
    Job.objects.filter(pk=job.pk).update(result={"nested": [1, None, "x"]}, last_error="e")
    fetched = sql.fetch(str(job.pk))
    assert fetched is not None
    assert fields(fetched) == fields(Job.objects.get(pk=job.pk))
    assert fetched._state.adding is False and fetched._state.db == "default"


def test_fetch_of_an_unknown_id_is_none():
    assert sql.fetch(str(uuid.uuid4())) is None


@pytest.fixture(params=["returning", "update then select"])
def claim_path(request, monkeypatch):
    """Both ways sql.claim reads the row back (PostgreSQL and SQLite use RETURNING)."""
    plan = sql._row_plan(connections["default"])
    monkeypatch.setattr(plan, "returning", request.param == "returning")


def test_claim_starts_only_due_active_jobs_with_attempts_left(claim_path):
    now = timezone.now()
    due = schedule(tasks.record, in_=0, args=["a"], max_attempts=1)
    later = schedule(tasks.record, in_=60, args=["b"])
    assert sql.claim(str(later.pk), "w", now + timedelta(seconds=1), 2) is None
    claimed = sql.claim(str(due.pk), "w", now + timedelta(seconds=1), 2)
    assert claimed is not None
    assert fields(claimed) == fields(Job.objects.get(pk=due.pk))
    assert (claimed.status, claimed.attempts, claimed.deliveries) == (Status.RUNNING, 1, 1)
    assert claimed.worker == "w" and claimed.started_at == now + timedelta(seconds=1)
    # Still running: that delivery never recorded an outcome (its worker was lost). Not
    # before it started half a lease ago (its worker may still run it); then the same
    # attempt is delivered again, not counted twice, up to max_deliveries times.
    half = sql.takeover_delay()
    assert (
        sql.claim(str(due.pk), "w2", now + timedelta(seconds=1) + half - timedelta(seconds=0.1), 2)
        is None
    )
    assert Job.objects.get(pk=due.pk).deliveries == 1
    again = sql.claim(str(due.pk), "w2", now + timedelta(seconds=1) + half, 2)
    assert again is not None
    assert (again.attempts, again.deliveries, again.worker) == (1, 2, "w2")
    assert sql.claim(str(due.pk), "w3", now + timedelta(seconds=3) + 2 * half, 2) is None
    # waiting, but no attempts left
    Job.objects.filter(pk=due.pk).update(status=Status.RETRYING)
    assert sql.claim(str(due.pk), "w4", now + timedelta(seconds=4), 2) is None
    Job.objects.filter(pk=later.pk).update(status=Status.CANCELLED)
    assert sql.claim(str(later.pk), "w", now + timedelta(minutes=2), 2) is None
    assert sql.claim(str(uuid.uuid4()), "w", now, 2) is None


def test_a_new_attempt_starts_its_deliveries_again():
    job = schedule(tasks.record, in_=0, args=["a"])
    first = sql.claim(str(job.pk), "w", timezone.now() + timedelta(seconds=1), 3)
    assert first is not None and (first.attempts, first.deliveries) == (1, 1)
    Job.objects.filter(pk=job.pk).update(status=Status.RETRYING)
    second = sql.claim(str(job.pk), "w", timezone.now() + timedelta(seconds=1), 3)
    assert second is not None and (second.attempts, second.deliveries) == (2, 1)


@pytest.mark.parametrize("stale_part", ["attempts", "deliveries"])
def test_update_fenced_writes_only_for_the_running_delivery(stale_part):
    scheduled = schedule(tasks.record, in_=0, args=["a"])
    job = sql.claim(str(scheduled.pk), "w", timezone.now() + timedelta(seconds=1), 3)
    assert job is not None
    stale = Job.objects.get(pk=job.pk)
    setattr(stale, stale_part, getattr(stale, stale_part) - 1)
    assert sql.update_fenced(stale, {"status": Status.SUCCEEDED}) is False
    done = {"status": Status.SUCCEEDED, "finished_at": timezone.now(), "result": {"ok": [1]}}
    with transaction.atomic():
        assert sql.update_fenced(job, done) is True
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.result) == (Status.SUCCEEDED, {"ok": [1]})
    assert sql.update_fenced(job, {"status": Status.DEAD}) is False  # no longer running


def test_insert_event_appends_to_the_history():
    job = schedule(tasks.record, in_=60, args=["a"])
    sql.insert_event(job, "started", "worker:x", "attempt 1 of 5")
    event = job.events.last()
    assert (event.kind, event.actor, event.message, event.attempt) == (
        "started", "worker:x", "attempt 1 of 5", 0,
    )  # fmt: skip


def test_only_the_claim_commits_without_waiting_for_the_disk(monkeypatch):
    """On PostgreSQL the claim's COMMIT does not wait for its WAL flush; the action's
    transaction, which records the outcome, still does. Elsewhere nothing is changed."""
    from django_delayjobs.execution import Execution

    conn = connections["default"]
    seen: dict[str, list[object]] = {"claim": [], "outcome": []}

    def setting() -> object:
        if conn.vendor != "postgresql":
            return None
        with conn.cursor() as cursor:
            cursor.execute("SHOW synchronous_commit")
            return cursor.fetchone()[0]

    def claim(*args, **kwargs):
        job = original_claim(*args, **kwargs)
        seen["claim"].append(setting())  # as the claim's transaction will commit
        return job

    def update_fenced(*args, **kwargs):
        seen["outcome"].append(setting())
        return original_update(*args, **kwargs)

    original_claim, original_update = sql.claim, sql.update_fenced
    monkeypatch.setattr(sql, "claim", claim)
    monkeypatch.setattr(sql, "update_fenced", update_fenced)
    job = schedule(tasks.record, in_=0, args=["x"])
    before = setting()
    result = Execution("default", str(job.pk), "w").run()
    assert result.outcome == "succeeded"
    if conn.vendor == "postgresql":
        assert before == "on"
        assert seen == {"claim": ["off"], "outcome": ["on"]}
        assert setting() == "on"  # the claim's transaction only
    else:
        assert seen == {"claim": [None], "outcome": [None]}


def test_a_claim_inside_another_transaction_leaves_its_commit_waiting():
    """The claim of the next job inside an outcome's transaction (the default) changes
    nothing about that transaction's COMMIT."""
    conn = connections["default"]
    job = schedule(tasks.record, in_=0, args=["x"])
    with transaction.atomic(), CaptureQueriesContext(conn) as queries:
        assert sql.claim(str(job.pk), "w", timezone.now(), 2) is not None
        if conn.vendor == "postgresql":
            with conn.cursor() as cursor:
                cursor.execute("SHOW synchronous_commit")
                assert cursor.fetchone()[0] == "on"
    assert "synchronous_commit" not in queries[0]["sql"]


def test_the_claim_is_one_statement_and_its_event_another():
    """The claim's transaction costs two round trips and its COMMIT, wherever the
    database returns updated rows (PostgreSQL, SQLite)."""
    from django_delayjobs.execution import Execution

    conn = connections["default"]
    job = schedule(tasks.record, in_=0, args=["x"])
    execution = Execution("default", str(job.pk), "w")
    with CaptureQueriesContext(conn) as queries:
        assert execution.claim() is not None
    body = [q["sql"] for q in queries if q["sql"].split()[0] not in ("BEGIN", "COMMIT")]
    assert len(body) == 2, body
    assert body[0].startswith("UPDATE") and "INSERT INTO" in body[1]
    wanted = "set_config('synchronous_commit', 'off', true)"
    assert (wanted in body[0]) == (conn.vendor == "postgresql")
