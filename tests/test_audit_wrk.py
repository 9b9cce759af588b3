"""The worker process's life, round 2: signals, a database that hangs under the
housekeeping, the metrics thread, and the end of the shutdown grace."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from django_delayjobs import schedule
from django_delayjobs.conf import delayjobs_settings
from django_delayjobs.connection import redis_client
from django_delayjobs.engine import Engine
from django_delayjobs.models import Job, Status
from django_delayjobs.worker import Options, WorkerProcess
from tests.helpers import wait_for
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def hold_the_database(held: threading.Event, release: threading.Event) -> None:
    """On PostgreSQL, hold the events' table as a long migration would (on SQLite the
    running atomic action holds the database's write lock itself, for as long as it
    runs, which is what the pruning's transaction waits for)."""
    try:
        if connection.vendor == "postgresql":
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("LOCK TABLE django_delayjobs_jobevent IN ACCESS EXCLUSIVE MODE")
                held.set()
                release.wait(30)
        held.set()
    finally:
        connection.close()


def test_a_database_that_hangs_under_the_pruning_stops_no_lease_nor_heartbeat(settings):
    """The automatic pruning (and the owner check, the WAL checkpoint) ran in the thread
    that extends the leases and sends the heartbeats: a database that hung under them (a
    lock, a network cut) stopped both, so the worker looked dead and other workers ran the
    jobs it was still running once their leases ended."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "LEASE_SECONDS": 1, "HEARTBEAT_SECONDS": 0.3}
    engine = Engine(redis_client(), prefix=delayjobs_settings.PREFIX)  # not reset below
    job = schedule(tasks.slow, in_=0, args=["slow", 3.0])
    process = WorkerProcess(engine, Options(queues=["default"], tick=0.1))
    thread = threading.Thread(target=process.run)
    held, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=hold_the_database, args=(held, release))
    thread.start()
    try:
        wait_for(lambda: Job.objects.get(pk=job.pk).status == Status.RUNNING)
        holder.start()
        held.wait(10)
        # the pruning's next pass now waits for the database
        settings.DELAYJOBS = {**settings.DELAYJOBS, "PRUNE_AFTER_SECONDS": 60}
        unack = engine.keys("default").unack
        for n in range(9):  # 1.8 s: past the lease and the heartbeat's expiry
            release.wait(0.2)
            now_ms = engine.server_time_ms()
            assert (engine.client.zscore(unack, str(job.pk)) or 0) > now_ms, n
            assert engine.stats("default").live_workers == 1
    finally:
        release.set()
        holder.join(30)
        process.stop()
        thread.join(30)
        engine.close()
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED
