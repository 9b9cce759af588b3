"""Operations under failure: the health checks, the metrics and the worker's metrics port
against a database that does not answer, hostile clients and keys another program wrote.
Real servers only (the suite's Redis, the test database)."""

from __future__ import annotations

import socket
import threading
import urllib.request
import uuid
from datetime import timedelta
from io import StringIO

import psycopg
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections
from django.utils import timezone

from django_delayjobs import bounded, health, schedule_many
from django_delayjobs.connection import get_engine
from django_delayjobs.engine import WrongType
from django_delayjobs.metrics import snapshot, store
from django_delayjobs.metrics.recorder import Recorder
from django_delayjobs.outcomes import Outcome
from django_delayjobs.services import build_job
from tests.helpers import unreachable_engine, wait_for
from tests.test_health import beat, overdue
from tests.test_health import health as health_lines
from tests.test_metrics import T0, result
from tests.testapp import tasks

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
        thread.join(bounded.DATABASE_TIMEOUT_SECONDS + 5)
        answered = not thread.is_alive()
    finally:
        lock.rollback()
        lock.close()
        thread.join(10)
        for read in database_reads():
            read.join(10)
    assert answered, "delayjobs_health still waits for the locked job table"
    assert codes == [1]
    lines = out.getvalue().splitlines()
    assert any(line.startswith("FAIL database") for line in lines), lines
    assert any(line.startswith("FAIL overdue:default") for line in lines), lines


def database_reads() -> list[threading.Thread]:
    """The threads of the health checks' database reads under way."""
    return [t for t in threading.enumerate() if t.name == "delayjobs-health-database"]


def count_threads(prefix: str) -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith(prefix))


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the other end closed ``sock`` (without waiting)."""
    sock.setblocking(False)  # a timeout would make recv wait for data
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False


def test_clients_that_send_nothing_are_dropped_from_the_workers_metrics_port(monkeypatch, capfd):
    """A client that connects and sends nothing (a scraper host that vanished mid-scrape,
    a port scanner, a hostile client) held a thread and a file descriptor of the worker
    process for ever. Now it is dropped after a timeout, without a traceback on stderr,
    and a scrape still answers."""
    from django_delayjobs.metrics import server as metrics_server

    monkeypatch.setattr(metrics_server, "REQUEST_TIMEOUT_SECONDS", 1.0)
    srv = metrics_server.MetricsServer("127.0.0.1", 0).start()
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as idle:
            assert idle.recv(1) == b""  # closed by the server, not held
        with urllib.request.urlopen(srv.url, timeout=10) as response:
            assert response.status == 200
        assert "Traceback" not in capfd.readouterr().err
    finally:
        srv.close()


def test_clients_that_send_nothing_cannot_pile_up_on_the_workers_metrics_port():
    """Each such client took a thread and a file descriptor of the worker process: enough
    of them and the worker could open no database or Redis connection. At most
    MAX_CONNECTIONS are served at a time; more are closed at once."""
    from django_delayjobs.metrics import server as metrics_server

    most = metrics_server.MAX_CONNECTIONS
    srv = metrics_server.MetricsServer("127.0.0.1", 0).start()
    idle: list[socket.socket] = []
    try:
        before = count_threads("Thread-")
        for _ in range(3 * most):
            idle.append(socket.create_connection(("127.0.0.1", srv.port), timeout=10))
        wait_for(lambda: sum(closed_by_peer(s) for s in idle) >= 2 * most, timeout=5)
        assert count_threads("Thread-") - before <= most
    finally:
        for sock in idle:
            sock.close()
        srv.close()


def test_a_metrics_key_of_the_wrong_type_does_not_count_its_queues_jobs_again_each_second(
    engine, redis_client
):
    """A queue's flush is one MULTI/EXEC; Redis runs every command of an EXEC but the one
    that meets a key of the wrong type (another program's). The flush failed, the queue's
    counts were all kept for the next one, and the commands that had been applied (the
    minute's hash, here) were applied again at every flush: the charts counted each job
    once a second. Now only what Redis refused is kept, and written once it can be."""
    recorder = Recorder()
    t0 = T0.timestamp()
    minute = int(t0 // 60)
    recorder.record("b", result(Outcome.SUCCEEDED), now=t0)
    redis_client.set(store.totals_key(engine, "b"), "x")  # another program's string
    for second in range(3):
        with pytest.raises(WrongType):
            recorder.flush(engine, ["b"], now=t0 + second)
    assert store.minutes(engine, "b", minute, minute)[minute]["jobs:succeeded"] == 1
    redis_client.delete(store.totals_key(engine, "b"))
    recorder.flush(engine, ["b"], now=t0 + 3)
    assert store.totals(engine, ["b"])["b"]["jobs:succeeded"] == 1
    assert store.minutes(engine, "b", minute, minute)[minute]["jobs:succeeded"] == 1
    assert recorder.tallies == {}


@pytest.mark.django_db
def test_a_metrics_key_of_the_wrong_type_hides_its_queue_not_every_queue(engine, redis_client):
    """The metrics of every queue were a 503 "Redis is unavailable" while one queue's
    totals key had the wrong type; now that queue alone lacks its counters (its gauges
    are read, and it is named unreadable: tests/test_audit_hlt.py)."""
    recorder = Recorder()
    for queue in ("a", "b"):
        engine.add(queue, {str(uuid.uuid4()): 10**13})
        recorder.record(queue, result(Outcome.SUCCEEDED))
    recorder.flush(engine, ["a", "b"])
    redis_client.delete(store.totals_key(engine, "b"))
    redis_client.set(store.totals_key(engine, "b"), "x")
    readings = {r.name: r for r in snapshot.read(engine)}
    assert readings["b"].totals == {}
    assert readings["a"].jobs("succeeded") == 1


def test_counts_a_stopping_worker_cannot_write_are_reported_not_dropped_in_silence(caplog):
    """A worker flushes its last second of counts when it stops; with Redis unreachable
    then they were dropped without a word (the loss showed only as counters short of
    the jobs). Now one warning says how many outcomes were lost."""
    from django_delayjobs.metrics import recorder

    down = unreachable_engine()
    mine = Recorder()
    for _ in range(3):
        mine.record("q", result(Outcome.SUCCEEDED))
    mine.record("q", result(Outcome.RETRYING, failed=True))
    with caplog.at_level("WARNING", logger="django_delayjobs.metrics"):
        recorder.last_flush(down, ["q"], mine)
    [record] = [r for r in caplog.records if r.name == "django_delayjobs.metrics"]
    assert "4 outcome(s)" in record.getMessage() and "lost" in record.getMessage()


def test_two_health_checks_at_once_both_pass_while_the_database_answers():
    """Two probes at the same moment (a load balancer's and Kubernetes', in a threaded
    web server): the second found the first one's database check under way and failed at
    once, "did not answer within 5 s", though the database answered the first one a
    moment later. It now waits for that check to end (within its own 5 s), then asks."""
    if connection.vendor != "postgresql":
        pytest.skip("the check must be held under way: a lock holds PostgreSQL's reads only")
    lock = locked_job_table()  # the first check waits until it is released
    found: list[health.Check] = []

    def first() -> None:
        try:
            found.append(health.check_database())
        finally:
            connections.close_all()

    thread = threading.Thread(target=first, daemon=True)
    try:
        thread.start()
        wait_for(database_reads)
        threading.Timer(0.5, lock.rollback).start()  # the database answers soon after
        second = health.check_database()
    finally:
        lock.rollback()
        thread.join(10)
        lock.close()
    assert found and found[0].ok, found
    assert second.ok, second


def test_oldest_overdue_sees_a_ready_job_behind_a_hundred_cancelled_ones():
    """Ids cancelled while ready stay in the ready list as tombstones until a worker pops
    them. With the oldest 100 entries all tombstones, the oldest-overdue gauge and the
    health check's overdue:<queue> read 0 ("nothing waits") while a live job behind them
    had waited for minutes, with no worker taking it."""
    now = timezone.now()
    jobs = [
        build_job(tasks.record, at=now - timedelta(seconds=400 - n), args=[str(n)])
        for n in range(snapshot.READY_HEAD + 1)
    ]  # the last one, due 300 s ago, stays
    schedule_many(jobs)
    engine = get_engine()
    engine.promote("default")
    for job in jobs[:-1]:
        assert job.cancel()
    stats = engine.stats("default")
    assert stats.ready == 1
    assert snapshot.oldest_overdue(engine, stats) >= 299
    code, lines = health_lines("--min-workers", "0")
    assert code == 1 and any(line.startswith("FAIL overdue:default") for line in lines), lines
