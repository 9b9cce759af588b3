"""Operations under failure: the health checks, the metrics and the worker's metrics port
against a database that does not answer, hostile clients and keys another program wrote.
Real servers only (the suite's Redis, the test database)."""

from __future__ import annotations

import threading
from io import StringIO

import psycopg
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections

from django_delayjobs import health
from django_delayjobs.connection import get_engine
from tests.test_health import beat, overdue

pytestmark = pytest.mark.django_db(transaction=True)


def locked_job_table() -> psycopg.Connection:
    """A session of its own holding ACCESS EXCLUSIVE on the job table, as an ALTER TABLE
    of a migration does: every read of the table waits until it ends (rollback)."""
    s = connection.settings_dict
    conn = psycopg.connect(dbname=s["NAME"], user=s["USER"], password=s["PASSWORD"] or None,
                           host=s["HOST"] or None, port=s["PORT"] or None)  # fmt: skip
    conn.execute("LOCK TABLE django_delayjobs_job IN ACCESS EXCLUSIVE MODE")
    return conn


def test_health_answers_within_its_bound_while_the_job_table_is_locked():
    """The database check waits at most DATABASE_TIMEOUT_SECONDS; a queue with a ready
    job must not then wait for that job's row in the probe's own thread, for as long as
    the table stays locked (or a frozen database host never answers)."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite's readers are never held by a lock for longer than its busy timeout")
    beat()
    overdue()
    get_engine().promote("default")  # a ready job: its due time is its row's
    out = StringIO()
    codes: list[int] = []

    def probe() -> None:
        try:
            call_command("delayjobs_health", stdout=out)
            codes.append(0)
        except CommandError as exc:
            codes.append(exc.returncode)
        finally:
            connections.close_all()

    lock = locked_job_table()
    thread = threading.Thread(target=probe, daemon=True)
    try:
        thread.start()
        thread.join(health.DATABASE_TIMEOUT_SECONDS + 5)
        answered = not thread.is_alive()
    finally:
        lock.rollback()
        lock.close()
        thread.join(10)
        if health._waiting is not None:
            health._waiting.join(10)
    assert answered, "delayjobs_health still waits for the locked job table"
    assert codes == [1]
    lines = out.getvalue().splitlines()
    assert any(line.startswith("FAIL database") for line in lines), lines
    assert any(line.startswith("FAIL overdue:default") for line in lines), lines
