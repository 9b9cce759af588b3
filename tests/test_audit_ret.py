"""Audit of retention and the operations commands: rows other tables refer to, hostile
arguments, Redis and the database down."""

from __future__ import annotations

import logging
import sqlite3
from datetime import timedelta
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_delayjobs.connection import get_engine
from django_delayjobs.models import Job, Status
from django_delayjobs.retention import AutoPrune
from tests.helpers import wait_for
from tests.test_health import private_redis, stopped_redis  # noqa: F401 (fixtures)
from tests.testapp.models import Receipt

pytestmark = pytest.mark.django_db(transaction=True)

#: More ids than SQLite takes as parameters of one statement (32,766 by default).
MANY = 32_800


@pytest.fixture
def stock_sqlite_limit():
    """``apply()``: SQLite's default limit of 32,766 parameters per statement on the test
    connection (Debian's build raises it to 250,000), where it is SQLite's; restored at
    the end."""
    limit = sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER
    applied = []

    def apply() -> None:
        if connection.vendor == "sqlite":
            raw = connection.connection
            applied.append((raw, raw.setlimit(limit, 32_766)))

    yield apply
    for raw, old in applied:
        if raw is connection.connection:  # not closed since
            raw.setlimit(limit, old)


def old_jobs(n: int, finished_ago: timedelta) -> list[Job]:
    now = timezone.now()
    return Job.objects.bulk_create(
        Job(queue="default", action="tests.nothing", run_at=now - timedelta(days=100),
            status=Status.SUCCEEDED, finished_at=now - finished_ago)
        for _ in range(n)
    )  # fmt: skip


def copies(job: Job, n: int) -> None:
    """``n`` more rows like ``job``'s (new ids), each referred to by a ``Receipt``: made
    by the database, in a fraction of the time 2 * 32,800 model instances take."""
    clone_rows(job, n)
    quote, table = connection.ops.quote_name, connection.ops.quote_name(Job._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {quote(Receipt._meta.db_table)} ({quote('job_id')})"
            f" SELECT {quote(Job._meta.pk.column)} FROM {table}"
        )


def clone_rows(job: Job, n: int) -> None:
    """``n`` more rows like ``job``'s, with new ids, made by the database."""
    quote, table = connection.ops.quote_name, connection.ops.quote_name(Job._meta.db_table)
    pk = quote(Job._meta.pk.column)
    columns = ", ".join(quote(f.column) for f in Job._meta.concrete_fields if not f.primary_key)
    new_id = (
        "gen_random_uuid()" if connection.vendor == "postgresql" else "lower(hex(randomblob(16)))"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({pk}, {columns}) WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL"
            f" SELECT i + 1 FROM n WHERE i < %s) SELECT {new_id}, {columns} FROM {table}, n"
            f" WHERE {table}.{pk} = %s",
            [n, Job._meta.pk.get_db_prep_value(job.pk, connection)],
        )


def prune(*args: str) -> str:
    out = StringIO()
    call_command("delayjobs_prune", *args, stdout=out)
    return out.getvalue()


def auto_prune_settings() -> override_settings:
    return override_settings(DELAYJOBS={**settings.DELAYJOBS, "PRUNE_AFTER_SECONDS": 86400})


def test_prune_leaves_more_jobs_than_sqlite_takes_parameters_that_a_model_protects(
    caplog, stock_sqlite_limit
):
    """Every refused job's id was remembered and sent back in every batch's NOT IN: past
    32,766 of them SQLite refused the statement ("too many SQL variables"), the command
    failed and the automatic prune retried for ever, pruning nothing more."""
    [kept] = old_jobs(1, timedelta(days=50))  # the oldest: every batch meets them first
    copies(kept, MANY - 1)
    assert Receipt.objects.count() == Job.objects.count() == MANY
    others = old_jobs(5, timedelta(days=40))
    stock_sqlite_limit()  # after the bulk inserts, which Django sized by the build's limit
    caplog.set_level(logging.WARNING, logger="django_delayjobs")
    assert "would delete 5 " in prune("--older-than", "30d", "--dry-run")
    # Small batches: the ids found before the last batch (32,790) are more than SQLite takes.
    out = prune("--older-than", "30d", "--batch", "10", "--max-rate", "0")
    assert f"left {MANY} job(s) that another table refers to" in out, out
    assert not Job.objects.filter(pk__in=[j.pk for j in others]).exists()
    assert Job.objects.count() == MANY
    [warning] = [r.getMessage() for r in caplog.records if "refer" in r.getMessage()]
    assert f"{MANY} job(s)" in warning and "testapp.Receipt" in warning, warning
    more = old_jobs(3, timedelta(days=40))
    with auto_prune_settings():
        done = AutoPrune(get_engine(), batch=50).step()
    assert done is not None and done.jobs == 3, done
    assert Job.objects.count() == MANY
    assert "automatic pruning failed" not in caplog.text
    assert not Job.objects.filter(pk__in=[j.pk for j in more]).exists()


@pytest.fixture
def hand_table():
    """``refer_to(jobs)``: rows of a table of the user's with a real foreign key to the
    job table and no Django model, so only the database knows of it."""
    key = "uuid" if connection.vendor == "postgresql" else "char(32)"
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE audit_ret_note (id integer PRIMARY KEY, job_id {key} NOT NULL "
            f"REFERENCES {Job._meta.db_table} (id))"
        )

    def refer_to(jobs: list[Job]) -> None:
        rows = [(n, Job._meta.pk.get_db_prep_value(j.pk, connection)) for n, j in enumerate(jobs)]
        with connection.cursor() as cursor:
            cursor.executemany("INSERT INTO audit_ret_note (id, job_id) VALUES (%s, %s)", rows)

    yield refer_to
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE audit_ret_note")


def named(queries: CaptureQueriesContext, jobs: list[Job]) -> int:
    """The most of ``jobs`` one statement names."""
    return max(
        sum(j.pk.hex in q["sql"] or str(j.pk) in q["sql"] for j in jobs)
        for q in queries.captured_queries
    )


def test_rows_the_database_refuses_are_walked_past_by_statements_that_do_not_grow(
    hand_table, caplog
):
    """A refusal only the database knows of (no model says so) is found by deleting one
    job at a time; the jobs found were then all named in every later statement."""
    refused = old_jobs(60, timedelta(days=50))
    hand_table(refused)
    others = old_jobs(15, timedelta(days=40))
    caplog.set_level(logging.WARNING, logger="django_delayjobs")
    with CaptureQueriesContext(connection) as queries:
        out = prune("--older-than", "30d", "--batch", "10", "--max-rate", "0")
    assert "left 60 job(s) that another table refers to" in out, out
    assert set(Job.objects.values_list("pk", flat=True)) == {j.pk for j in refused}
    assert not Job.objects.filter(pk__in=[j.pk for j in others]).exists()
    assert named(queries, refused) <= 10  # at most a batch's
    [warning] = [r.getMessage() for r in caplog.records if "refer" in r.getMessage()]
    assert "60 job(s)" in warning, warning
    # The automatic prune: a second pass of the process does not try them again.
    caplog.clear()
    with auto_prune_settings():
        pruner = AutoPrune(get_engine(), every=0.05, batch=10, batches=100)
        first = pruner.step()
        assert first is not None and first.protected == 60 and pruner.cutoff is None, first
        more = old_jobs(3, timedelta(days=40))
        with CaptureQueriesContext(connection) as queries:
            wait_for(lambda: pruner.step() is not None, timeout=5)
    assert not Job.objects.filter(pk__in=[j.pk for j in more]).exists()
    assert named(queries, refused) <= 1, [q["sql"] for q in queries.captured_queries]
    assert [r.getMessage() for r in caplog.records if "refer" in r.getMessage()] == [warning]
    assert "testapp" not in warning  # no model refers to them


# -- delayjobs_reconcile ------------------------------------------------------------------


def reconcile() -> str:
    out = StringIO()
    call_command("delayjobs_reconcile", stdout=out)
    return out.getvalue()


@pytest.mark.usefixtures("stopped_redis")
def test_reconcile_fails_when_redis_is_down_even_with_nothing_to_repair():
    """With no waiting job in the database the pass never asked Redis anything, and said
    "repaired 0 job(s)" with exit 0: a check after an outage passed while Redis was down."""
    with pytest.raises(CommandError, match="Redis is unreachable"):
        reconcile()


def test_reconcile_fails_when_redis_refuses_writes_even_with_nothing_to_repair(request):
    client = request.getfixturevalue("private_redis")
    client.config_set("min-replicas-to-write", 1)  # every write refused: NOREPLICAS
    try:
        with pytest.raises(CommandError, match=r"refuses writes.*NOREPLICAS"):
            reconcile()
    finally:
        client.config_set("min-replicas-to-write", 0)
    assert reconcile() == "repaired 0 job(s)\n"
