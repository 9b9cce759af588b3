"""Follow-ups of today's reviews: a credential cut in two by the quote of a failure, and
what the reconcile and prune commands say when they stop partway.

Every delivery here goes to a real server on 127.0.0.1, run by a real (in-process,
``--burst``) worker."""

from __future__ import annotations

import io
import itertools
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings

from django_delayjobs import reconcile, schedule, schedule_http, worker
from django_delayjobs.connection import get_engine
from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.engine import PartlyUnavailable
from django_delayjobs.models import Job, Status
from django_delayjobs.progress import Progress
from django_delayjobs.worker import Options, WorkerProcess
from tests.helpers import age_rows, wait_for
from tests.test_audit_cls3 import node, settings_for
from tests.test_audit_hlt import off_directory
from tests.test_audit_ops2 import session
from tests.test_audit_sec import TOKEN, allow, burst, shown
from tests.test_retention import make
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


# -- 1. a token the cut of a quoted failure splits ------------------------------------------------


def test_a_url_token_split_by_the_cut_of_a_quoted_failure_is_masked(
    raw_server, settings, redis_client, caplog
):
    """A status line that echoes the request line is quoted up to 200 characters: the
    masking came after the cut, so a token that straddled character 200 was no longer
    whole, not masked, and its first part stayed in the job's error, history and log."""

    def echo(conn) -> None:
        conn.sendall(server.requests[-1])

    server = raw_server(echo)
    allow(settings, server)
    # The quote is "POST /hook/<pad>?token=<TOKEN> HTTP/1.1": the token starts at 190.
    pad = "p" * (190 - len("POST /hook/?token="))
    caplog.set_level(logging.INFO)
    job = schedule_http(f"{server.url('/hook/' + pad)}?token={TOKEN}", in_=0, max_attempts=1)
    burst()
    job.refresh_from_db()
    assert job.status == Status.DEAD and "no answer (network)" in job.last_error
    assert "?token=***... (" in job.last_error  # the cut start masked, the cut said
    logged = [record.getMessage() for record in caplog.records]
    texts = [job.last_error, *job.events.values_list("message", flat=True), *shown(job), *logged]
    assert any(pad in text for text in logged)  # the log does quote the failure
    for text in texts:
        assert TOKEN[:6] not in text


# -- 2. a reconcile sweep that one Redis fails partway --------------------------------------------


class FreezeAtRow(Progress):
    """Progress whose ``row``-th mark (the loop's own is the first) stops ``redis``."""

    def __init__(self, redis: EmbeddedRedis, row: int) -> None:
        super().__init__()
        self.redis, self.row, self.marks = redis, row, 0

    def watch(self, pause: float) -> Callable[[], None]:
        mark = super().watch(pause)

        def marked() -> None:
            mark()
            self.marks += 1
            if self.marks == self.row and self.redis.pid is not None:
                os.kill(self.redis.pid, signal.SIGSTOP)

        return marked


def held_by_redis() -> int:
    stats = get_engine().stats("default")
    return stats.pending + stats.ready


def test_a_sweep_one_redis_fails_partway_is_retried_after_the_backoff(
    own_jobs_redis, caplog, monkeypatch
):
    """One Redis that stopped answering after the sweep's first page was repaired made the
    sweep raise ``PartlyUnavailable``, which the loop took for a Cluster's dead master (the
    others served): it waited RECONCILE_SECONDS (60), not the backoff it waits when Redis
    fails at the sweep's start, to repair the rest once Redis was back."""
    monkeypatch.setattr(reconcile, "CHUNK", 1)  # the scheduled job repaired before the next
    schedule(tasks.record, in_=0, args=["scheduled"])
    retrying = schedule(tasks.record, in_=0, args=["retrying"])
    Job.objects.filter(pk=retrying.pk).update(status=Status.RETRYING)  # a page of its own
    get_engine().client.flushdb()
    process = WorkerProcess(get_engine(), Options(queues=["default"]))
    process.progress = FreezeAtRow(own_jobs_redis, row=3)  # the retrying job's row
    thread = threading.Thread(target=process.reconcile_loop)
    thread.start()
    try:
        wait_for(lambda: "reconcile: Redis is unavailable" in caplog.text)
        assert own_jobs_redis.pid is not None
        os.kill(own_jobs_redis.pid, signal.SIGCONT)
        assert held_by_redis() == 1  # the scheduled job's page was repaired
        wait_for(lambda: held_by_redis() == 2, timeout=10)
    finally:
        process.stop()
        thread.join(30)
    assert not thread.is_alive()


# -- 3. a full reconcile the database stops partway -----------------------------------------------


@pytest.fixture
def postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("a session ended by another (pg_terminate_backend): PostgreSQL")


def terminated_before(matches: Callable[[str, Any], bool]) -> Callable[..., Any]:
    """An ``execute_wrapper`` that ends this session from another one (a failover, an
    operator's ``pg_terminate_backend``) just before the first query ``matches``."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    done: list[bool] = []

    def wrapper(execute, sql, params, many, context):
        if not done and matches(sql, params):
            done.append(True)
            with session() as other:
                other.execute("SELECT pg_terminate_backend(%s)", [pid])
        return execute(sql, params, many, context)

    return wrapper


def test_a_reconcile_the_database_stops_partway_says_what_it_had_repaired(postgresql, monkeypatch):
    """A Redis that fails partway prints the repair so far, then the error; a database
    that failed partway printed the error only, as if nothing had been repaired."""
    monkeypatch.setattr(reconcile, "CHUNK", 1)  # the scheduled job repaired before the next
    schedule(tasks.record, in_=0, args=["scheduled"])
    retrying = schedule(tasks.record, in_=0, args=["retrying"])
    Job.objects.filter(pk=retrying.pk).update(status=Status.RETRYING)  # a page of its own
    age_rows()  # a job just scheduled is re-added but not counted
    get_engine().client.flushdb()
    out = io.StringIO()
    ended = terminated_before(lambda sql, params: Status.RETRYING in (params or ()))
    try:
        with (
            connection.execute_wrapper(ended),
            pytest.raises(CommandError, match="the jobs database 'default'") as failed,
        ):
            call_command("delayjobs_reconcile", stdout=out)
    finally:
        connection.close()  # ended: the next query opens a new one
    assert failed.value.returncode == 1
    assert out.getvalue() == "default: re-added 1 job(s)\nrepaired 1 job(s)\n"
    assert held_by_redis() == 1  # the scheduled job's page


# -- 4. a prune the database stops partway ---------------------------------------------------------


def test_a_prune_the_database_stops_partway_says_how_much_it_had_deleted(postgresql):
    """The database failing at the second batch (its session ended by a failover): the
    command exited 1 with the error only, not saying that a batch had been deleted."""
    first, second = (make(Status.SUCCEEDED) for _ in range(2))
    Job.objects.filter(pk=second.pk).update(finished_at=first.finished_at + timedelta(seconds=1))
    deletes = itertools.count()
    ended = terminated_before(lambda sql, params: "DELETE" in sql and next(deletes) == 1)
    out = io.StringIO()
    try:
        with (
            connection.execute_wrapper(ended),
            pytest.raises(CommandError, match="the jobs database 'default'") as failed,
        ):
            call_command("delayjobs_prune", "--older-than", "30d", "--batch", "1", "-v", "0",
                         stdout=out)  # fmt: skip
    finally:
        connection.close()  # ended: the next query opens a new one
    assert failed.value.returncode == 1
    assert re.fullmatch(
        r"deleted 1 succeeded,cancelled,skipped jobs finished before \S+ \S+ UTC, with 2 "
        r"event\(s\), in 1 batch\(es\) before the database failed\n",
        out.getvalue(),
    ), out.getvalue()
    assert list(Job.objects.values_list("pk", flat=True)) == [second.pk]


@pytest.mark.cluster
def test_a_prune_with_a_master_down_purges_the_garbage_of_the_others(on_lonely, caplog):
    """On a Cluster with one master down, the prune gave up purging dead ids from the
    garbage at its first failure: the queues on the masters that answer kept the ids of
    their pruned jobs (counted as garbage for ever). Each queue is purged on its own."""
    cluster, client = on_lonely
    address, [lost], [healthy, *_] = off_directory(client, 1, 1)
    with override_settings(DELAYJOBS=settings_for(cluster)):
        engine = get_engine()
        jobs = {queue: make(Status.DEAD) for queue in (lost, healthy)}  # lost's first
        for queue, job in jobs.items():
            Job.objects.filter(pk=job.pk).update(queue=queue)
            engine.adopt(queue, [str(job.pk)], 60_000)
            engine.bury(queue, [str(job.pk)])
        cluster.kill(node(cluster, address))
        try:
            call_command("delayjobs_prune", "--older-than", "30d", "--status", "dead",
                         "--batch", "1", "-v", "0", stdout=io.StringIO())  # fmt: skip
            kept = engine.garbage(healthy)
        finally:
            cluster.restart(node(cluster, address))
    assert not Job.objects.exists()
    assert kept == []
    assert "pruning left 1 deleted dead job id(s)" in caplog.text  # the down master's


# -- 5. a sweep that one Redis refuses partway (a wrong type) ----------------------------------


def test_a_sweep_a_queues_wrong_type_key_fails_partway_waits_reconcile_seconds(
    own_jobs_redis, settings, monkeypatch
):
    """On one Redis, a sweep that a refusal failed partway (a queue's key another program
    overwrote: WrongType; out of memory; a replica) raised ``PartlyUnavailable`` and the
    loop retried it after the backoff (0.2-5 s), as for Redis down: but a refusal does not
    heal by itself and Redis answers the sweep's probe, so the whole sweep ran again every
    few seconds for ever. Only an unreachable Redis is retried soon now."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "RECONCILE_SECONDS": 600}
    schedule(tasks.record, in_=60, args=["blocked"], queue="blocked")
    schedule(tasks.record, in_=60, args=["fine"], queue="fine")
    engine = get_engine()
    engine.client.flushdb()
    engine.client.set(engine.keys("blocked").pending, "another program's")
    sweeps: list[BaseException | None] = []
    real = worker.reconcile

    def counted(*args, **kwargs):
        try:
            result = real(*args, **kwargs)
        except BaseException as exc:
            sweeps.append(exc)
            raise
        sweeps.append(None)
        return result

    monkeypatch.setattr(worker, "reconcile", counted)
    process = WorkerProcess(engine, Options(queues=["fine"]))

    def loop() -> None:
        try:
            process.reconcile_loop()
        finally:  # this thread's connections, as the worker's threads do
            worker.drop_connections()

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        wait_for(lambda: sweeps)
        time.sleep(2.5)  # the backoff would have run it ~5 times more by now
    finally:
        process.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert len(sweeps) == 1
    assert isinstance(sweeps[0], PartlyUnavailable)
    assert engine.stats("fine").pending == 1  # the other queue was repaired
