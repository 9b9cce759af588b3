"""The reconcile sweep, third pass: a job that dies between the sweep's read of its row and
its queue's repair; due times SQLite holds as a REAL or a BLOB; the partial report of
``delayjobs_reconcile``."""

from __future__ import annotations

import io
import uuid

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import OperationalError, connection

from django_delayjobs import reconcile as sweep
from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.models import Job, Status
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_partial_report_says_what_was_taken_out_of_garbage_before_the_database_failed(
    monkeypatch, redis_client
):
    """A database failure partway printed the repair so far only if a job was re-added
    (or skipped): ids already taken out of garbage, those of the queue under way too, were
    left out, as if nothing had been done."""
    monkeypatch.setattr(sweep, "CHUNK", 100)
    engine = get_engine()
    job = schedule(tasks.record, in_=0, args=["x"])  # lists the queue; then finished
    Job.objects.filter(pk=job.pk).update(status=Status.SUCCEEDED)
    engine.remove("default", [str(job.pk)])
    garbage = engine.keys("default").garbage
    # ids whose rows are gone; more than a small sorted set, which ZSCAN reads at once
    redis_client.zadd(garbage, {str(uuid.uuid4()): n for n in range(300)})
    reads: list[str] = []

    def failing(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        if "LIMIT" not in sql.upper() and '"status"' in sql and " IN (" in sql.upper():
            reads.append(sql)
            if len(reads) == 2:  # the second chunk of garbage: the database went away
                raise OperationalError("server closed the connection unexpectedly")
        return execute(sql, params, many, context)

    out = io.StringIO()
    with connection.execute_wrapper(failing), pytest.raises(CommandError):
        call_command("delayjobs_reconcile", stdout=out)
    cleared = 300 - redis_client.zcard(garbage)
    assert len(reads) == 2 and 0 < cleared < 300
    assert f"default: took {cleared} id(s) out of garbage whose job is not dead" in out.getvalue()
