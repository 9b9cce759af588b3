"""Audit of retention, third round: jobs that share one finish time, the one-by-one
fallback, the dry run's query."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now
from django.utils import timezone

from django_delayjobs import retention
from django_delayjobs.models import Job
from tests.test_audit_ret import hand_table, old_jobs  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def test_jobs_finished_at_one_database_time_are_each_pruned_across_batches():
    """The walk's position was the finish time read into Python and written back: on
    SQLite ``Now()`` stores '... 00:30:58.502', which came back as '... 00:30:58.502000',
    past every other job of that time. A prune of 95 such jobs deleted the first batch,
    found nothing after it and said it was done."""
    old_jobs(95, timedelta(days=40))
    Job.objects.update(finished_at=Now())  # one time for all, as the database writes it
    cutoff = timezone.now() + timedelta(days=1)
    assert retention.count(cutoff, retention.DEFAULT_STATUSES).jobs == 95
    done = retention.prune(cutoff, batch=10)
    assert (done.jobs, done.batches, done.complete) == (95, 10, True), done
    assert not Job.objects.exists()


@pytest.mark.skipif(connection.vendor != "sqlite", reason="a finish time that is not one")
def test_the_one_by_one_batch_goes_past_a_finish_time_that_cannot_be_read(hand_table):  # noqa: F811
    """After a refusal the batch is retried one job at a time, its jobs read through the
    ORM: a row whose finish time is not one raised ValueError there, so every pass (the
    automatic one every minute) stopped at that batch and pruned nothing more."""
    jobs = old_jobs(25, timedelta(days=40))
    hand_table([jobs[3]])
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Job._meta.db_table} SET finished_at = %s WHERE id = %s",
            ["2020-99-99 00:00:00", jobs[5].pk.hex],
        )
    done = retention.prune(timezone.now() - timedelta(days=30), batch=10)
    assert (done.jobs, done.protected, done.complete) == (24, 1, True), done
    assert list(Job.objects.values_list("pk", flat=True)) == [jobs[3].pk]


def count_plans(plans: list[str]):  # type: ignore[no-untyped-def]
    """An ``execute_wrapper`` that adds to ``plans`` the plan of each ``count(`` query
    (in a transaction: on PostgreSQL a few rows would be read by a sequential scan)."""

    def explain(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        if "count(" in sql.lower() and not sql.startswith("EXPLAIN"):
            cursor = context["cursor"]
            if connection.vendor == "postgresql":  # few rows: the planner would read them all
                cursor.execute("SET LOCAL enable_seqscan = off")
            prefix = "EXPLAIN QUERY PLAN " if connection.vendor == "sqlite" else "EXPLAIN "
            cursor.execute(prefix + sql, params)
            plans.append("\n".join(str(row) for row in cursor.fetchall()))
        return execute(sql, params, many, context)

    return explain


def test_a_dry_run_counts_through_the_index_the_prune_walks():
    """The dry run counted through the ORM: SQLite, without statistics, read every job of
    the statuses through the (status, run_at) index, the ones kept for 30 days too."""
    old_jobs(5, timedelta(days=40))
    plans: list[str] = []
    explain = count_plans(plans)
    with transaction.atomic(), connection.execute_wrapper(explain):
        found = retention.count(timezone.now() - timedelta(days=30), retention.DEFAULT_STATUSES)
    assert (found.jobs, found.events) == (5, 0)
    assert plans and all("delayjobs_finished_at" in plan for plan in plans), plans


@pytest.fixture
def refusing_trigger():
    """``refuse(job)``: a trigger of the user's refuses to delete that job, as a trigger
    does (PostgreSQL: ``RAISE EXCEPTION``, SQLSTATE P0001; SQLite: ``RAISE(ABORT)``)."""
    table, kept = Job._meta.db_table, []

    def refuse(job: Job) -> None:
        pk = Job._meta.pk.get_db_prep_value(job.pk, connection)
        kept.append(pk)
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(
                    "CREATE FUNCTION audit_ret3_keep() RETURNS trigger LANGUAGE plpgsql AS $$"
                    f" BEGIN IF OLD.id = '{pk}' THEN RAISE EXCEPTION 'kept by audit';"
                    " END IF; RETURN OLD; END $$"
                )
                cursor.execute(
                    f"CREATE TRIGGER audit_ret3_keep BEFORE DELETE ON {table}"
                    " FOR EACH ROW EXECUTE FUNCTION audit_ret3_keep()"
                )
            else:
                cursor.execute(
                    f"CREATE TRIGGER audit_ret3_keep BEFORE DELETE ON {table}"
                    f" WHEN OLD.id = '{pk}' BEGIN SELECT RAISE(ABORT, 'kept by audit'); END"
                )

    yield refuse
    if not kept:
        return
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("DROP FUNCTION audit_ret3_keep() CASCADE")  # and its trigger
        else:
            cursor.execute("DROP TRIGGER audit_ret3_keep")


def test_a_job_a_trigger_keeps_is_left_and_the_others_pruned(refusing_trigger, caplog):
    """A trigger's refusal is an error of its own kind on PostgreSQL (P0001, Django's
    ``InternalError``), not an ``IntegrityError``: the batch was not retried one job at a
    time, and every prune (the automatic one each minute) failed at that batch for ever."""
    jobs = old_jobs(25, timedelta(days=40))
    refusing_trigger(jobs[12])
    done = retention.prune(timezone.now() - timedelta(days=30), batch=10)
    assert (done.jobs, done.protected, done.complete) == (24, 1, True), done
    assert list(Job.objects.values_list("pk", flat=True)) == [jobs[12].pk]
    [warning] = [r.getMessage() for r in caplog.records if "left 1 job" in r.getMessage()]
    assert "the database refused their delete: kept by audit" in warning, warning


def test_a_job_requeued_after_its_batch_chose_it_does_not_end_the_prune():
    """On SQLite a batch's jobs are chosen before its transaction; one requeued in between
    is left, and the batch then deleted fewer jobs than its size, which the prune took for
    "none left": it said it was done with the rest of the jobs still there."""
    jobs = old_jobs(25, timedelta(days=40))
    table, requeued = Job._meta.db_table, []

    def requeue_first(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        if sql.startswith("BEGIN") and not requeued:
            requeued.append(jobs[0])
            execute(f"UPDATE {table} SET status = 'scheduled', finished_at = NULL WHERE id = %s",
                    [jobs[0].pk.hex], False, context)  # fmt: skip
        return execute(sql, params, many, context)

    with connection.execute_wrapper(requeue_first):
        done = retention.prune(timezone.now() - timedelta(days=30), batch=10)
    assert (done.jobs, done.complete) == (25 - len(requeued), True), done
    assert list(Job.objects.values_list("pk", flat=True)) == [j.pk for j in requeued]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="times SQLite does not have")
@pytest.mark.parametrize("finished_at", ["-infinity", "0044-03-15 12:00:00+00 BC"])
@pytest.mark.parametrize("refusal", [False, True], ids=["batch", "one by one"])
def test_a_finish_time_python_cannot_read_does_not_stop_the_prune(finished_at, refusal, hand_table):  # noqa: F811
    """The batch's last job is where the next batch starts, read into Python: a finish
    time before year 1 (written by hand) raised DataError there, and each prune (the
    automatic one every minute) stopped at that batch for ever."""
    jobs = old_jobs(25, timedelta(days=40))
    if refusal:  # the batch is then retried one job at a time
        hand_table([jobs[3]])
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Job._meta.db_table} SET finished_at = %s WHERE id = %s",
            [finished_at, jobs[5].pk],
        )
    done = retention.prune(timezone.now() - timedelta(days=30), batch=1)
    assert (done.jobs, done.complete) == (25 - refusal, True), done
    assert list(Job.objects.values_list("pk", flat=True)) == [jobs[3].pk] * refusal
