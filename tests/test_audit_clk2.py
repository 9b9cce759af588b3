"""Audit of the start written for a running row found ahead of the claiming host's clock.

The first delivery that found a running row's ``started_at`` ahead of its host's clock
wrote that host's now as the start. A host whose clock was behind found every live row it
was handed ahead of it, and moved each one's start back by its own lag: a worker with a
correct clock then took the row over while its worker still ran it (a worker may still
hold an id from a batch it claimed before Redis lost its data). The start is now the
database's time, and only where the start is ahead of the database's clock too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from unittest import mock

import pytest
from django.db import connections
from django.utils import timezone

from django_delayjobs import sql
from django_delayjobs.conf import delayjobs_settings
from django_delayjobs.execution import Execution
from django_delayjobs.models import Job, Status
from django_delayjobs.services import schedule
from tests.testapp import tasks

from .test_audit_clk import deferred

pytestmark = pytest.mark.django_db(transaction=True)
Q = "default"
#: How far the finding host's clock is behind: more than half a lease (150 s).
LAG = timedelta(minutes=10)
#: SQLite's clock counts whole milliseconds.
MS = timedelta(milliseconds=1)


@contextmanager
def clock_behind(by: timedelta) -> Iterator[None]:
    """This process's clock, as Django reads it, ``by`` behind (the database's is not)."""
    real = timezone.now
    with mock.patch("django.utils.timezone.now", side_effect=lambda: real() - by):
        yield


def started_by_a(start: datetime) -> Job:
    """A job due an hour ago (due on a slow clock too) that worker A runs since ``start``."""
    job = schedule(tasks.record, at=timezone.now() - timedelta(hours=1), args=["a"])
    claimed = sql.claim(str(job.pk), "A", timezone.now(), delayjobs_settings.MAX_DELIVERIES)
    assert claimed is not None
    Job.objects.filter(pk=job.pk).update(started_at=start)
    claimed.refresh_from_db()
    return claimed


def test_a_finder_whose_clock_is_behind_leaves_a_live_start_as_it_is():
    """A started the job just now: a finder ten minutes behind finds that start ahead of
    its clock. It used to write its own time, ten minutes back, and a worker with a right
    clock then took the row over from A at once."""
    job = started_by_a(timezone.now())
    with clock_behind(LAG):
        retry_at = deferred(Execution(Q, str(job.pk), "B").claim())
    row = Job.objects.get(pk=job.pk)
    assert row.started_at == job.started_at and job.started_at is not None
    assert retry_at == job.started_at + sql.takeover_delay()
    assert deferred(Execution(Q, str(job.pk), "C").claim()) == retry_at
    row.refresh_from_db()
    assert (row.status, row.deliveries, row.worker) == (Status.RUNNING, 1, "A")


def test_a_start_ahead_becomes_the_databases_time_whatever_the_finders_clock():
    job = started_by_a(timezone.now() + timedelta(days=1))
    before = timezone.now()
    with clock_behind(LAG):
        retry_at = deferred(Execution(Q, str(job.pk), "B").claim())
    after = timezone.now()
    row = Job.objects.get(pk=job.pk)
    assert row.started_at is not None and before - MS <= row.started_at <= after
    assert retry_at == row.started_at + sql.takeover_delay()
    assert (row.status, row.deliveries, row.worker) == (Status.RUNNING, 1, "A")


def test_the_databases_time_compares_with_the_times_the_workers_write():
    """The start the database wrote (on SQLite text of its own, to the millisecond) reads
    back as the time it is, and the claim's SQL compares it with a claiming host's time
    as the worker compares it in Python: taken over half a lease after it, not before."""
    job = started_by_a(timezone.now() + timedelta(days=1))
    retry_at = deferred(Execution(Q, str(job.pk), "B").claim())
    row = Job.objects.get(pk=job.pk)
    assert row.started_at is not None and retry_at == row.started_at + sql.takeover_delay()
    assert deferred(Execution(Q, str(job.pk), "C").claim()) == retry_at
    most = delayjobs_settings.MAX_DELIVERIES
    assert sql.claim(str(job.pk), "C", retry_at - 2 * sql._HUNDREDTH, most) is None
    claimed = sql.claim(str(job.pk), "C", retry_at + 2 * sql._HUNDREDTH, most)
    assert claimed is not None and (claimed.deliveries, claimed.worker) == (2, "C")


@pytest.fixture
def database_in_paris() -> Iterator[None]:
    """The jobs' database stores local time (its ``TIME_ZONE``): SQLite then holds
    Paris's wall-clock text, which the database's own ``Now()`` (UTC) does not match."""
    conn = connections[sql.db()]
    saved = conn.settings_dict.get("TIME_ZONE")

    def use(zone: str | None) -> None:
        conn.settings_dict["TIME_ZONE"] = zone
        for cached in ("timezone", "timezone_name"):
            conn.__dict__.pop(cached, None)

    use("Europe/Paris")
    try:
        yield
    finally:
        use(saved)


@pytest.mark.usefixtures("database_in_paris")
def test_a_start_ahead_is_rewritten_to_now_in_a_database_that_stores_local_time():
    """Review: in a SQLite database stored in Paris's time, UTC text written by ``Now()``
    read back an hour or two early, and any worker took the live job over at once."""
    job = started_by_a(timezone.now() + timedelta(days=1))
    before = timezone.now()
    retry_at = deferred(Execution(Q, str(job.pk), "B").claim())
    after = timezone.now()
    row = Job.objects.get(pk=job.pk)
    assert row.started_at is not None and before - MS <= row.started_at <= after
    assert retry_at == row.started_at + sql.takeover_delay()
    assert deferred(Execution(Q, str(job.pk), "C").claim()) == retry_at
