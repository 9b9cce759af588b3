"""Operations under hostile conditions (second round): retention, metrics, health and
stats against real servers (the suite's Redis, private ones, the test database)."""

from __future__ import annotations

import sqlite3
import threading
from datetime import timedelta

import psycopg
import pytest
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.utils import timezone

from django_delayjobs import retention, services
from django_delayjobs.connection import get_engine
from django_delayjobs.models import Job, JobEvent, Status
from tests.helpers import in_thread, wait_for
from tests.test_retention import dead_in_garbage, make, prune

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_dead_prune_on_sqlites_default_transactions_survives_a_workers_commit():
    """Django opens SQLite transactions DEFERRED unless told otherwise: one that began
    with a read (the batch's dead ids) could not write once another connection had
    committed, and the prune failed at once with "database is locked" while a worker ran.
    A worker's write made after each statement of the batch's transaction must not stop
    it (the write waits for the prune's lock instead, here not at all: timeout 0)."""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's deferred transactions")
    dead, other_job = make(Status.DEAD), make(Status.SCHEDULED)
    connection.ensure_connection()
    mode, connection.transaction_mode = connection.transaction_mode, None  # Django's default
    worker = sqlite3.connect(connection.settings_dict["NAME"], timeout=0, isolation_level=None)
    writes: list[bool] = []

    def a_worker_commits(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if connection.in_atomic_block:
            try:
                worker.execute("UPDATE django_delayjobs_job SET worker = 'w' WHERE id = ?",
                               [other_job.pk.hex])  # fmt: skip
                writes.append(True)
            except sqlite3.OperationalError:  # the prune holds the write lock: it waits
                writes.append(False)
        return result

    try:
        with connection.execute_wrapper(a_worker_commits):
            out = prune("--older-than", "30d", "--status", "dead")
    finally:
        connection.transaction_mode = mode
        worker.close()
    assert "deleted 1 dead jobs" in out
    assert writes  # the worker did try while the batch's transaction was open
    assert not Job.objects.filter(pk=dead.pk).exists()


# -- a requeue racing the prune (PostgreSQL: row locks, two sessions) ---------------------


def waiting_for_a_lock() -> bool:
    """Whether another session of the test database waits for a row lock."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        return bool(cursor.fetchone()[0])


@pytest.fixture
def postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("two sessions and row locks (PostgreSQL)")


def test_a_requeue_not_yet_committed_keeps_its_job_from_the_prune(postgresql):
    """The requeue's UPDATE holds the row: the prune skips it (SKIP LOCKED) rather than wait
    or delete it, and once the requeue commits the job waits in Redis with its history."""
    dead = make(Status.DEAD)
    requeued, go, out = threading.Event(), threading.Event(), []

    def requeue_and_hold() -> bool:
        with transaction.atomic():
            won = services.requeue(dead)
            requeued.set()
            go.wait(10)
        return won

    thread = in_thread(requeue_and_hold, out)
    assert requeued.wait(10)
    try:
        pruned = prune("--older-than", "30d", "--status", "dead")
    finally:
        go.set()
        thread.join(10)
    assert "deleted 0 dead jobs" in pruned
    assert out == [True]
    row = Job.objects.get(pk=dead.pk)
    assert row.status == Status.SCHEDULED
    assert JobEvent.objects.filter(job=dead, kind="requeued").exists()
    stats = get_engine().stats("default")
    assert stats.pending + stats.ready == 1  # due now: added straight to ready


def test_a_requeue_made_while_the_prune_deletes_its_job_is_refused_not_an_error(postgresql):
    """The prune's batch locks and deletes the row; a requeue arriving meanwhile waits for
    it, then finds no dead job: False (the admin and the API say "not requeued"), no
    IntegrityError, no history row left without its job, and nothing added to Redis."""
    dead = make(Status.DEAD)
    cutoff = timezone.now() - timedelta(days=30)
    deleted, go, pruning, requeuing = threading.Event(), threading.Event(), [], []

    def prune_and_hold() -> int:
        with transaction.atomic():
            done = retention.delete_batch(cutoff, [Status.DEAD], 50)
            deleted.set()
            go.wait(10)
        return done.jobs

    pruner = in_thread(prune_and_hold, pruning)
    assert deleted.wait(10)
    requeuer = in_thread(lambda: services.requeue(dead), requeuing)
    try:
        wait_for(waiting_for_a_lock, timeout=10)
    finally:
        go.set()
        pruner.join(10)
        requeuer.join(10)
    assert pruning == [1]
    assert requeuing == [False]
    assert not Job.objects.filter(pk=dead.pk).exists()
    assert not JobEvent.objects.filter(job_id=dead.pk).exists()
    stats = get_engine().stats("default")
    assert stats.pending + stats.ready == 0


# -- only finished jobs, whoever calls ----------------------------------------------------


@pytest.mark.parametrize("statuses", [
    [Status.SCHEDULED], ["running"], [Status.SUCCEEDED, Status.RETRYING], "dead", [],
])  # fmt: skip
def test_the_prune_deletes_no_job_that_can_still_run_whatever_its_caller_names(statuses):
    """'Only finished jobs are ever deleted' held for the command's --status only:
    ``retention.prune`` (and its dry-run ``count``) took any status, and deleted waiting
    and running jobs whose finish time was old (a row written by hand or by another program)."""
    waiting = [make(status) for status in (Status.SCHEDULED, Status.RUNNING, Status.RETRYING)]
    cutoff = timezone.now() - timedelta(days=30)
    with pytest.raises(ValueError, match=r"finished status|no status"):
        retention.count(cutoff, statuses)
    with pytest.raises(ValueError, match=r"finished status|no status"):
        retention.prune(cutoff, statuses)
    assert Job.objects.filter(pk__in=[j.pk for j in waiting]).count() == 3


# -- a prune the database stops midway ---------------------------------------------------


def test_a_prune_the_database_stops_midway_exits_1_with_each_batch_whole(postgresql):
    """A database error in a later batch (here the event table held by a migration past
    the session's lock_timeout): the command exits 1 naming the database; each batch is
    whole: the first one's job and history gone and its dead id out of the Redis garbage,
    the other job kept with its history and its id."""
    first, second = dead_in_garbage("default", 2)
    old = timezone.now() - timedelta(days=40)
    Job.objects.filter(pk=first.pk).update(finished_at=old)  # pruned first
    Job.objects.filter(pk=second.pk).update(finished_at=old + timedelta(seconds=1))
    migration = session()
    locking: list[threading.Thread] = []

    def a_migration_after_the_first_batch(execute, sql, params, many, context):
        if "DELETE" in sql and not locking:
            execute("SET lock_timeout = '200ms'", None, False, context)
            result = execute(sql, params, many, context)
            # Queued behind this batch's transaction, ahead of the next batch's.
            lock = "LOCK TABLE django_delayjobs_jobevent IN ACCESS EXCLUSIVE MODE"
            locking.append(threading.Thread(target=migration.execute, args=[lock]))
            locking[0].start()
            wait_for(waiting_for_a_lock, timeout=10)
            return result
        return execute(sql, params, many, context)

    try:
        with (
            connection.execute_wrapper(a_migration_after_the_first_batch),
            pytest.raises(CommandError, match="the jobs database 'default'") as failed,
        ):
            prune("--older-than", "30d", "--status", "dead", "--batch", "1")
    finally:
        for thread in locking:
            thread.join(10)
        migration.close()
    assert failed.value.returncode == 1
    assert not Job.objects.filter(pk=first.pk).exists()
    assert not JobEvent.objects.filter(job_id=first.pk).exists()
    assert Job.objects.filter(pk=second.pk, status=Status.DEAD).exists()
    assert JobEvent.objects.filter(job_id=second.pk).exists()
    assert [job_id for job_id, _ in get_engine().garbage("default")] == [str(second.pk)]


def session() -> psycopg.Connection:
    """A session of the test database of its own (autocommit off: a LOCK is held until it
    is closed)."""
    s = connection.settings_dict
    return psycopg.connect(dbname=s["NAME"], user=s["USER"], password=s["PASSWORD"] or None,
                           host=s["HOST"] or None, port=s["PORT"] or None)  # fmt: skip
