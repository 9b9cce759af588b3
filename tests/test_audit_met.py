"""Audit of the metrics and health: values in Redis that no worker or script wrote, the
worker's metrics port against a client that trickles its request, and the worker's
housekeeping when only its metrics flush fails. Real servers only (the suite's Redis, the
test database)."""

from __future__ import annotations

import math
import select
import socket
import threading
import time

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.metrics import history, store
from django_delayjobs.metrics.recorder import Recorder
from django_delayjobs.outcomes import Outcome
from django_delayjobs.worker import Options, WorkerProcess
from tests.helpers import wait_for
from tests.test_metrics import TOKEN, get, parser, result
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def token(settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "METRICS_TOKEN": TOKEN}


def scrape() -> dict[tuple[str, str], float]:
    """``delayjobs_jobs_total`` by (queue, outcome), through the view, with the token;
    every sample of the scrape is a finite number."""
    response = get(Client(), TOKEN)
    assert response.status_code == 200, response.content[:200]
    families = list(parser.text_string_to_metric_families(response.content.decode()))
    assert all(math.isfinite(s.value) for f in families for s in f.samples)
    return {(s.labels["queue"], s.labels["outcome"]): s.value
            for f in families if f.name == "delayjobs_jobs" for s in f.samples}  # fmt: skip


@pytest.mark.parametrize(
    ("field", "value"),
    [("jobs:dead", b"many"), ("jobs:dead", b"inf"), ("jobs:dead", b"1e400"),
     ("run:sum", b"nan"), (b"\xff\xfe", b"1")],
)  # fmt: skip
def test_a_metrics_field_no_worker_wrote_is_left_out_not_a_500(token, redis_client, field, value):
    """A queue's metrics hash with a field another program wrote (a value that is not a
    finite number, a name that is not UTF-8) made every scrape a 500 (the view; a
    traceback on the worker's port) and the admin's charts a 500: one odd field is left
    out now, as the engine's reader leaves out a counter that is not an integer."""
    engine = get_engine()
    recorder = Recorder()
    now = time.time()
    recorder.record("default", result(Outcome.SUCCEEDED), now=now)
    recorder.flush(engine, ["default"], now=now)
    minute = int(now // 60)
    for key in (store.totals_key(engine, "default"), store.minute_key(engine, "default", minute)):
        redis_client.hset(key, field, value)
    jobs = scrape()
    assert jobs[("default", "succeeded")] == 1 and jobs[("default", "dead")] == 0
    (found,) = history.read(engine, ["default"], 1, now=minute)
    assert found.jobs.get("succeeded") == 1 and "dead" not in found.jobs
    assert found.started == 1 and math.isfinite(found.quantile(0.5) or 0)


class Running:
    """A worker process run in a thread of this one; ``error`` is what ``run`` raised."""

    def __init__(self, **options: object) -> None:
        self.process = WorkerProcess(get_engine(), Options(queues=["default"], **options))
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.run)

    def run(self) -> None:
        try:
            self.process.run()
        except BaseException as exc:  # WorkerDied: reported by the test, not by pytest
            self.error = exc

    def __enter__(self) -> Running:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.stop()
        self.thread.join(10)


def snapshot_taken(engine, queue: str) -> bool:
    minute = int(time.time() // 60)
    found = store.minutes(engine, queue, minute - 1, minute)
    return any("snap:added" in fields for fields in found.values())


def test_an_engine_counter_no_script_wrote_does_not_kill_the_worker(redis_client):
    """The worker's metrics flush snapshots the engine's ``added``/``removed`` counters
    once a minute; a counter another program set to a value that is not an integer made
    it raise ValueError, which killed the housekeeping thread: the worker exited 1, and
    again each time it was restarted. The engine's reader leaves such a counter out (the
    queue page, health/ and metrics/ read it as 0); so does the snapshot now."""
    engine = get_engine()
    redis_client.hset(engine.keys("default").counters, "added", "many")
    with Running(tick=0.1) as worker:
        wait_for(lambda: worker.error is not None or snapshot_taken(engine, "default"))
    assert worker.error is None
    assert worker.process.fatal is None


def test_a_client_that_trickles_its_request_is_dropped_from_the_workers_metrics_port(
    monkeypatch,
):
    """The port dropped a client that sent nothing for REQUEST_TIMEOUT_SECONDS, but the
    timeout was per read: a client sending a byte a little more often than that held its
    connection (one of the MAX_CONNECTIONS) for as long as it liked, so eight of them shut
    every scraper out. The whole request must come within the timeout."""
    from django_delayjobs.metrics import server as metrics_server

    monkeypatch.setattr(metrics_server, "REQUEST_TIMEOUT_SECONDS", 0.5)
    srv = metrics_server.MetricsServer("127.0.0.1", 0).start()
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as sock:
            start = time.monotonic()
            closed = False
            for byte in b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"x" * 100:
                if time.monotonic() - start > 2.0:
                    break
                try:
                    sock.sendall(bytes([byte]))
                except OSError:  # reset by the server
                    closed = True
                    break
                if select.select([sock], [], [], 0.1)[0]:  # the server's answer, or its EOF
                    closed = True
                    break
            elapsed = time.monotonic() - start
        assert closed and elapsed < 2.0, f"still open after {elapsed:.1f} s"
    finally:
        srv.close()


@pytest.mark.slow
def test_a_failing_metrics_flush_does_not_let_the_workers_heartbeat_lapse(settings, redis_client):
    """The housekeeping thread extends leases, beats and flushes the metrics in one loop,
    which backs off up to 5 s after a Redis error. A metrics key of the wrong type (another
    program's) fails every flush while Redis serves everything else, and the backoff held
    up the heartbeats (and lease extensions) due meanwhile: with HEARTBEAT_SECONDS = 1.2 a
    live worker dropped out of ``delayjobs_workers`` and failed ``health/`` within 10 s
    (with a LEASE_SECONDS under 15, its running jobs' leases could lapse too). A pause
    after an error never outlasts the time to the next lease extension and heartbeat.
    (Watched for 10 s: the backoff doubles from 0.2 s at each failed flush.)"""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "HEARTBEAT_SECONDS": 1.2}  # live for 3.6 s
    engine = get_engine()
    redis_client.set(store.totals_key(engine, "default"), "another program's")
    job = schedule(tasks.record, in_=0, args=["ran"])  # its count can never be written
    with Running(tick=0.1) as worker:
        wait_for(lambda: engine.stats("default").live_workers == 1)
        wait_for(lambda: type(job).objects.get(pk=job.pk).status == "succeeded")
        end = time.monotonic() + 10
        while time.monotonic() < end:
            assert engine.stats("default").live_workers == 1
            time.sleep(0.05)
    assert worker.error is None


def test_metrics_and_charts_read_a_client_that_decodes_its_replies(settings, redis_url):
    """The engine takes a client that answers str (a django-redis cache whose pool has
    ``decode_responses``; its readers accept bytes or str), but the metrics read every
    reply as bytes: each scrape was a 500 (``'str' object has no attribute 'decode'``),
    and so were the admin's queue page, whose charts read the same hashes, and
    ``health/`` while a job was ready (its due time is read as the metrics read it)."""
    settings.CACHES = {
        **settings.CACHES,
        "jobs": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_url,
                 "OPTIONS": {"CONNECTION_POOL_KWARGS": {"decode_responses": True}}},
    }  # fmt: skip
    settings.DELAYJOBS = {**settings.DELAYJOBS, "CACHE_ALIAS": "jobs", "METRICS_TOKEN": TOKEN}
    engine = get_engine()
    schedule(tasks.record, in_=0, args=["waits"])  # ready: its due time is read from its row
    assert engine.stats("default").ready == 1
    recorder = Recorder()
    now = time.time()
    recorder.record("default", result(Outcome.SUCCEEDED), now=now)
    recorder.flush(engine, ["default"], now=now)
    jobs = scrape()
    assert jobs[("default", "succeeded")] == 1 and jobs[("default", "scheduled")] == 1
    (found,) = history.read(engine, ["default"], 1, now=int(now // 60))
    assert found.jobs == {"succeeded": 1}
    health = Client().get(reverse("delayjobs_health"), {"min_workers": "0"})
    assert health.status_code == 200, health.content
    staff = Client()
    staff.force_login(User.objects.create_superuser("boss", "boss@example.com", "pw"))
    page = staff.get(reverse("admin:django_delayjobs_queues"))
    assert page.status_code == 200 and b"<svg" in page.content
