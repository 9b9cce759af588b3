"""Operations under hostile conditions (second round): retention, metrics, health and
stats against real servers (the suite's Redis, private ones, the test database)."""

from __future__ import annotations

import sqlite3

import pytest
from django.db import connection

from django_delayjobs.models import Job, Status
from tests.test_retention import make, prune

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
