"""Audit of retention (prn): the one-job-at-a-time retry after a refusal (a requeue racing
it, a job another transaction holds, the database failing part-way), a status that is not
text, the count of the jobs a model keeps."""

from __future__ import annotations

import threading
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.utils import timezone

from django_delayjobs import retention, services
from django_delayjobs.connection import get_engine
from django_delayjobs.models import Job, JobEvent, Status
from tests.helpers import WritesLocked, in_thread, wait_for
from tests.test_audit_ops2 import session
from tests.test_audit_ret import hand_table, old_jobs  # noqa: F401 (fixture)
from tests.test_audit_ret3 import count_plans
from tests.test_retention import dead_in_garbage
from tests.testapp.models import Receipt

pytestmark = pytest.mark.django_db(transaction=True)


def waiting_for_a_lock() -> bool:
    """Whether another session of the test database waits for a lock (read afresh: within
    a transaction PostgreSQL reads its sessions once)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        return bool(cursor.fetchone()[0])


@pytest.mark.skipif(
    connection.vendor == "sqlite", reason="SQLite's write lock, from the events' DELETE on"
)
def test_a_dead_job_requeued_during_the_one_by_one_delete_keeps_its_history(hand_table):  # noqa: F811
    """After a refusal a batch is retried one job per transaction, whose deletes restated
    the conditions but locked nothing: on PostgreSQL a requeue that committed between the
    events' DELETE and the job's left the job scheduled again, without its history."""
    [job] = dead_in_garbage("default")
    hand_table(old_jobs(1, timedelta(days=35)))  # the batch is refused: one by one
    events = JobEvent.objects.filter(job=job).count()
    table = connection.ops.quote_name(Job._meta.db_table)
    requeued: list[object] = []
    threads: list[threading.Thread] = []

    def requeue_before_the_jobs_delete(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        if sql.startswith(f"DELETE FROM {table}") and not threads:
            threads.append(in_thread(lambda: services.requeue(job), requeued))
            # Until it is done, or waits for this transaction's lock.
            wait_for(lambda: requeued or waiting_for_a_lock(), timeout=10)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(requeue_before_the_jobs_delete):
        done = retention.prune(timezone.now() - timedelta(days=30),
                               [Status.SUCCEEDED, Status.DEAD])  # fmt: skip
    threads[0].join(10)
    assert done.complete, done
    stats = get_engine().stats("default")
    if requeued == [True]:  # first: scheduled again, with its history
        assert Job.objects.get(pk=job.pk).status == Status.SCHEDULED
        assert JobEvent.objects.filter(job=job).count() == events + 1  # and "requeued"
        assert (stats.garbage, stats.pending + stats.ready) == (0, 1), stats
    else:  # second: gone, for good
        assert requeued == [False], requeued
        assert not Job.objects.filter(pk=job.pk).exists()
        assert not JobEvent.objects.filter(job=job).exists()
        assert (stats.garbage, stats.pending + stats.ready) == (0, 0), stats


def test_a_prune_the_database_stops_in_the_one_by_one_retry_says_what_it_deleted(hand_table):  # noqa: F811
    """The one-job-at-a-time retry commits each job: when the database failed part-way
    (here a lock held past the lock timeout), the jobs it had deleted were counted nowhere,
    and the command said it had deleted none."""
    jobs = old_jobs(10, timedelta(days=40))
    jobs.sort(key=lambda j: (j.finished_at, j.pk))
    hand_table([jobs[3]])  # the batch is refused: one by one
    locked, seen = WritesLocked(), [False]  # seen[0]: the sixth job's own delete

    def names(job: Job, params: object) -> bool:
        return bool({job.pk.hex, str(job.pk)} & {str(p) for p in params or ()})  # type: ignore[attr-defined]

    def lock_at_the_seventh_job(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        seen[0] = seen[0] or (names(jobs[5], params) and not names(jobs[6], params))
        if locked.holder is None:
            if connection.vendor == "postgresql" and seen[0] and names(jobs[6], params):
                locked.hold()  # its rows' lock waits for the table's
                execute("SET lock_timeout = '200ms'", None, False, context)
            elif connection.vendor == "sqlite" and seen[0] and sql.startswith("BEGIN"):
                locked.hold()  # the seventh job's transaction waits for the write lock
                connection.connection.execute("PRAGMA busy_timeout = 200")
        return execute(sql, params, many, context)

    try:
        with (
            connection.execute_wrapper(lock_at_the_seventh_job),
            pytest.raises(CommandError, match="database") as failed,
        ):
            out = StringIO()
            call_command("delayjobs_prune", "--older-than", "30d", "--batch", "50",
                         "--max-rate", "0", stdout=out)  # fmt: skip
    finally:
        locked.release()
        connection.close()  # its lock or busy timeout
    assert failed.value.returncode == 1
    gone = len(jobs) - Job.objects.filter(pk__in=[j.pk for j in jobs]).count()
    assert gone == 5, gone  # before the seventh: all but the refused one
    assert f"deleted {gone} " in out.getvalue(), out.getvalue()
    assert "before the database failed" in out.getvalue(), out.getvalue()


@pytest.mark.parametrize("status", [["dead"], None, 3])
def test_a_status_that_is_not_text_is_a_command_error(status):
    """``call_command("delayjobs_prune", status=[...])`` (a list, as for other commands'
    options) raised AttributeError from ``str.split``: a traceback, not the command's
    refusal (exit 2), while ``--older-than`` of the wrong type was refused."""
    [job] = old_jobs(1, timedelta(days=40))
    with pytest.raises(CommandError, match="comma-separated") as refused:
        call_command("delayjobs_prune", older_than="30d", status=status, stdout=StringIO())
    assert refused.value.returncode == 2
    assert Job.objects.filter(pk=job.pk).exists()


@pytest.mark.skipif(connection.vendor == "sqlite", reason="row locks")
def test_the_one_by_one_retry_skips_a_job_another_transaction_holds(hand_table):  # noqa: F811
    """A batch skips the jobs another transaction has locked (SKIP LOCKED), but its retry
    one job at a time waited for them: a transaction left open on one finished job held
    the prune (the workers' automatic one, in their database thread) for as long."""
    jobs = old_jobs(5, timedelta(days=40))
    hand_table([jobs[0]])  # the batch is refused: one by one
    other = session()
    other.execute(f"SELECT 1 FROM {Job._meta.db_table} WHERE id = %s FOR UPDATE", [jobs[2].pk])

    try:
        with connection.cursor() as cursor:  # a wait fails instead of holding the test
            cursor.execute("SET lock_timeout = '2s'")
        done = retention.prune(timezone.now() - timedelta(days=30))
    finally:
        other.close()
        connection.close()  # its lock timeout
    assert (done.jobs, done.protected) == (3, 1), done
    left = set(Job.objects.values_list("pk", flat=True))
    assert left == {jobs[0].pk, jobs[2].pk}, left
    assert retention.prune(timezone.now() - timedelta(days=30)).jobs == 1  # released since
    assert set(Job.objects.values_list("pk", flat=True)) == {jobs[0].pk}


def test_the_jobs_a_model_keeps_are_counted_through_the_index_the_prune_walks():
    """At the end of each pass (a worker's automatic one every hour) the prune counts the
    jobs a model keeps through the ORM: SQLite, without statistics, read every job of the
    statuses through the (status, run_at) index, the ones kept for 30 days too."""
    [kept] = old_jobs(1, timedelta(days=40))
    Receipt.objects.create(job=kept)
    old_jobs(3, timedelta(days=40))
    plans: list[str] = []
    explain = count_plans(plans)
    protected = retention.Protected()
    with transaction.atomic(), connection.execute_wrapper(explain):
        left = protected.count_referenced(timezone.now() - timedelta(days=30),
                                          retention.DEFAULT_STATUSES)  # fmt: skip
    assert left == 1
    assert plans and all("delayjobs_finished_at" in plan for plan in plans), plans
    done = retention.prune(timezone.now() - timedelta(days=30))
    assert (done.jobs, done.protected) == (3, 1), done
