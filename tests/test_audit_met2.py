"""Audit of the metrics and health, round 2: the last flush of a worker that stops, keys
another program wrote, jobs whose lease ran out with no promoter, the metrics port's
callers and a database that does not answer. Real servers only (the suite's Redis, private
redis-servers stopped with SIGSTOP, the test database)."""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import signal
import threading
import time

import pytest
import redis
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.urls import reverse

from django_delayjobs import bounded, health, schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.engine import Engine, EngineUnavailable
from django_delayjobs.metrics import history, store
from django_delayjobs.metrics.recorder import Recorder, last_flush
from django_delayjobs.outcomes import Outcome
from tests.helpers import wait_for
from tests.test_audit_ops import locked_job_table
from tests.test_audit_wdb import within
from tests.test_metrics import TOKEN, get, parser, result
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def token(settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "METRICS_TOKEN": TOKEN}


def gauge(name: str, queue: str = "default") -> float:
    """One queue's sample of a gauge, through the view, with the token."""
    response = get(Client(), TOKEN)
    assert response.status_code == 200, response.content[:200]
    for family in parser.text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("queue") == queue:
                return float(sample.value)
    raise AssertionError(f"no {name}{{queue={queue!r}}} in the scrape")


# -- the last flush -------------------------------------------------------------------------


def test_the_last_flush_waits_for_a_flush_under_way(own_redis, caplog):
    """A worker that stops flushes its counts a last time, and says how many outcomes it
    could not write. But that flush did not wait for the housekeeping thread's, under way
    at that moment: it found the counts taken, wrote nothing, said nothing, and the
    process exited with the housekeeping thread still holding them (Redis slow or not
    answering: lost without a word). Flushes now run one at a time."""
    assert own_redis.pid is not None
    engine = Engine(redis.Redis.from_url(own_redis.url, socket_timeout=0.3), prefix="t")
    recorder = Recorder()
    recorder.record("default", result(Outcome.SUCCEEDED))
    os.kill(own_redis.pid, signal.SIGSTOP)  # takes connections, answers nothing

    def housekeeping() -> None:
        with contextlib.suppress(EngineUnavailable):  # it logs it and tries again
            recorder.flush(engine, [])

    thread = threading.Thread(target=housekeeping)
    thread.start()
    try:
        wait_for(lambda: not recorder.tallies)  # it took the count: its write is under way
        with caplog.at_level(logging.WARNING, "django_delayjobs.metrics"):
            last_flush(engine, [], recorder)
    finally:
        thread.join(5)
    assert "the counts of 1 outcome(s) could not be written" in caplog.text


# -- keys another program wrote -------------------------------------------------------------


def test_one_queues_minute_key_of_the_wrong_type_hides_no_charts(redis_client):
    """A queue's running totals key of another type (another program's) leaves that queue
    out of scrapes, but one of its per-minute keys made the charts' read raise WrongType:
    the queue page showed no chart at all, for any queue, with "a key has the wrong type"
    where the charts were. That minute of that queue is left out now."""
    engine = get_engine()
    for queue in ("default", "orders"):
        schedule(tasks.record, in_=600, args=["x"], queue=queue)  # known queues
    recorder = Recorder()
    now = time.time()
    minute = int(now // 60)
    for queue in ("default", "orders"):
        recorder.record(queue, result(Outcome.SUCCEEDED), now=now)
    recorder.flush(engine, [], now=now)
    redis_client.set(store.minute_key(engine, "orders", minute - 1), "another program's")
    earlier, current = history.read(engine, ["default", "orders"], 2, now=minute)
    assert current.jobs.get("succeeded") == 2 and not earlier.jobs
    staff = Client()
    staff.force_login(User.objects.create_superuser("boss", "boss@example.com", "pw"))
    page = staff.get(reverse("admin:django_delayjobs_queues"))
    assert page.status_code == 200 and b"<svg" in page.content


# -- jobs whose lease ran out ---------------------------------------------------------------


def test_a_job_whose_lease_ran_out_with_no_promoter_is_overdue(token):
    """A job claimed by a worker that died stays in flight until a promoter recovers it
    when its lease ends. With no promoter running (a worker run with --worker-only, its
    promoter process gone) it waited for ever, while ``delayjobs_oldest_overdue_seconds``
    said 0 and ``health/``'s ``overdue:<queue>`` passed: the alert the docs give never
    fired. The time since the lease ended counts now."""
    engine = get_engine()
    schedule(tasks.record, in_=0, args=["x"])
    assert engine.claim("default", 1, lease_ms=50)  # by a worker that then died
    wait_for(lambda: engine.stats("default").expired_leases == 1)
    time.sleep(0.2)
    assert gauge("delayjobs_oldest_overdue_seconds") >= 0.2
    limits = health.Limits(("default",), max_overdue=0.1, min_workers=0)
    (overdue,) = [c for c in health.check_queue(engine, "default", limits)
                  if c.name == "overdue:default"]  # fmt: skip
    assert not overdue.ok, overdue


# -- the worker's metrics port --------------------------------------------------------------


def port_get(srv, host: str | None) -> tuple[int, bytes]:
    """GET /metrics from the port, with ``host`` as the Host header (None: none at all)."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    try:
        conn.putrequest("GET", "/metrics", skip_host=True)
        if host is not None:
            conn.putheader("Host", host)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


REBOUND = ["rebind.attacker.example:9808", "rebind.attacker.example", "127.0.0.1.nip.io",
           "localhost.attacker.example", None]  # fmt: skip


@pytest.mark.parametrize("host", REBOUND)
def test_the_open_metrics_port_answers_no_page_of_another_site(host):
    """Without METRICS_TOKEN the port is open on a loopback address, but a web page in a
    browser on the same host could read it all the same through DNS rebinding (its name
    resolved again to 127.0.0.1: the browser sends that name as Host and lets the page
    read the answer). It answers only a request for a loopback Host now (403 otherwise)."""
    from django_delayjobs.metrics import server as metrics_server

    srv = metrics_server.MetricsServer("127.0.0.1", 0).start()
    try:
        status, body = port_get(srv, host)
        assert status == 403 and b"delayjobs_" not in body, body[:200]
        for allowed in (f"127.0.0.1:{srv.port}", "localhost", f"LOCALHOST.:{srv.port}",
                        f"[::1]:{srv.port}", "127.0.0.2"):  # fmt: skip
            status, body = port_get(srv, allowed)
            assert status == 200 and b"delayjobs_jobs_total" in body, (allowed, status)
    finally:
        srv.close()


def test_a_port_with_a_token_answers_any_host(token):
    """With METRICS_TOKEN, a page cannot send the token: any Host is answered (a scraper
    may reach the port through a name of its own)."""
    from django_delayjobs.metrics import server as metrics_server

    srv = metrics_server.MetricsServer("127.0.0.1", 0).start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
        conn.request("GET", "/metrics", headers={"Host": "worker-3.internal:9808",
                                                 "Authorization": f"Bearer {TOKEN}"})  # fmt: skip
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        srv.close()


# -- a database that does not answer --------------------------------------------------------


def test_a_scrape_gives_up_on_a_database_that_does_not_answer(token, monkeypatch):
    """A ready job's due time is its row's, read with no time limit: while the job table
    was locked (a migration's ALTER TABLE), or the database host hung, each scrape waited
    for as long (a web worker held, or one of the metrics port's 8 connections), and
    Prometheus saw a timeout, not why. ``health/`` was bounded; the scrape now is too, by
    ``DATABASE_TIMEOUT_SECONDS``: 503, the database is unavailable."""
    if connection.vendor != "postgresql":
        pytest.skip("the read must be held: a lock holds PostgreSQL's reads only")
    from django_delayjobs.metrics import server as metrics_server

    monkeypatch.setattr(bounded, "DATABASE_TIMEOUT_SECONDS", 0.5)
    schedule(tasks.record, in_=0, args=["ready"])  # its due time is its row's
    srv = metrics_server.MetricsServer("127.0.0.1", 0).start()
    lock = locked_job_table()
    try:
        started = time.monotonic()
        response = within(10, lambda: get(Client(), TOKEN))
        assert response.status_code == 503, response.content[:200]
        assert response.content == b"the database is unavailable\n"
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert conn.getresponse().status == 503
        conn.close()
        assert time.monotonic() - started < 5
    finally:
        lock.rollback()
        lock.close()
        srv.close()
    assert gauge("delayjobs_oldest_overdue_seconds") >= 0  # answered again


def test_one_queues_ready_list_of_the_wrong_type_leaves_only_that_queue_out(token, redis_client):
    """Scrapes leave out a queue whose keys have the wrong type (another program's), as
    its stats fail. But the stats count ready jobs by the ready *set*: with its ready
    *list* overwritten while jobs were ready, the read of its oldest ready job raised
    WrongType, and every scrape answered 503 for the whole deployment. Only that queue is
    left out now (only ``delayjobs_queue_readable`` says it could not be read)."""
    engine = get_engine()
    schedule(tasks.record, in_=0, args=["ready"], queue="orders")
    schedule(tasks.record, in_=0, args=["ready"])
    redis_client.set(engine.keys("orders").ready, "another program's")
    assert engine.stats("orders").ready == 1
    assert gauge("delayjobs_queue_jobs") >= 0  # the default queue's series are there
    response = get(Client(), TOKEN)
    assert b'queue="orders",' not in response.content
    assert b'delayjobs_queue_readable{queue="orders"} 0.0' in response.content


def test_a_health_check_of_many_queues_waits_for_a_database_that_hangs_once(monkeypatch):
    """The due time of a queue's ready job is read within the bound; a check of several
    queues with ready jobs, the database answering its own check and then not (the job
    table locked in between), waited the bound once per queue: 100 queues, over 8 minutes.
    Once one read was given up on, the others fail at once while it still waits."""
    if connection.vendor != "postgresql":
        pytest.skip("the read must be held: a lock holds PostgreSQL's reads only")
    monkeypatch.setattr(bounded, "DATABASE_TIMEOUT_SECONDS", 0.5)
    queues = tuple(f"q{n}" for n in range(6))
    for queue in queues:
        schedule(tasks.record, in_=0, args=["ready"], queue=queue)
    engine = get_engine()
    limits = health.Limits(queues, min_workers=0)
    lock = locked_job_table()
    try:
        started = time.monotonic()
        checks = [c for q in queues for c in health.check_queue(engine, q, limits, rows=True)]
        took = time.monotonic() - started
    finally:
        lock.rollback()
        lock.close()
    overdue = [c for c in checks if c.name.startswith("overdue:")]
    assert len(overdue) == 6 and not any(c.ok for c in overdue), overdue
    assert took < 1.5, f"{took:.1f} s"
