"""Audit of the metrics, round 3: the view behind a project's login wall, and the worker's
metrics port against hostile requests. Real servers only (the suite's Redis, the test
database, the port's own HTTP server)."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest
from django.test import Client, override_settings

from django_delayjobs.connection import get_engine
from django_delayjobs.engine import EngineUnavailable
from django_delayjobs.metrics import store
from django_delayjobs.metrics.recorder import Recorder
from django_delayjobs.outcomes import Outcome
from tests.test_metrics import TOKEN, get, parser, result, user

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def login_wall(settings):
    """A project that requires a login for every view (Django's LoginRequiredMiddleware)."""
    settings.MIDDLEWARE = [*settings.MIDDLEWARE,
                           "django.contrib.auth.middleware.LoginRequiredMiddleware"]  # fmt: skip
    settings.DELAYJOBS = {**settings.DELAYJOBS, "METRICS_TOKEN": TOKEN}


def test_a_project_that_requires_logins_still_answers_the_scrapers_token(login_wall):
    """Behind ``LoginRequiredMiddleware`` (Django 5.1+, which this app requires) the view
    was never reached without a session: Prometheus, with the right token, was sent a 302
    to the login page (and, following it, parsed the login form's HTML as metrics), and a
    caller without credentials got that redirect instead of the view's 401 and
    ``WWW-Authenticate: Bearer``. The view does its own access control (a token, or a
    staff user who may view jobs), so it opts out of the middleware's."""
    response = get(Client(), TOKEN)
    assert response.status_code == 200, (response.status_code, response.get("Location"))
    families = {f.name for f in parser.text_string_to_metric_families(response.content.decode())}
    assert "delayjobs_jobs" in families
    anonymous = get(Client())
    assert anonymous.status_code == 401 and anonymous["WWW-Authenticate"].startswith("Bearer")
    staff = Client()
    staff.force_login(user("boss", su=True))
    assert get(staff).status_code == 200
    clerk = Client()
    clerk.force_login(user("clerk", staff=False))
    assert get(clerk).status_code == 403


def test_a_queue_whose_counters_cannot_be_read_still_has_its_outcomes_written(redis_client):
    """Once a minute a flush snapshots the engine's ``added``/``removed`` counters of each
    queue for the charts, read before the queue's MULTI/EXEC; when that read failed (a
    counters key of another program's type; on a Redis Cluster, the master of one shard
    of a sharded queue down while the queue's own master answers) the queue's outcomes
    were not written either, and since its snapshot was then still due, neither were
    they at any later flush: none reached the scrape until the counters could be read
    again, and a worker that stopped meanwhile lost them all. The outcomes are written;
    only the snapshot waits for the next flush."""
    engine = get_engine()
    redis_client.set(engine.keys("default").counters, "another program's")
    recorder = Recorder()
    now = time.time()
    recorder.record("default", result(Outcome.SUCCEEDED), now=now)
    with pytest.raises(EngineUnavailable):
        recorder.flush(engine, ["default"], now=now)
    assert store.totals(engine, ["default"])["default"].get("jobs:succeeded") == 1
    minute = int(now // 60)
    assert store.minutes(engine, "default", minute, minute)[minute].get("jobs:succeeded") == 1
    with pytest.raises(EngineUnavailable):  # the snapshot is due still, not the count
        recorder.flush(engine, ["default"], now=now)
    assert store.totals(engine, ["default"])["default"].get("jobs:succeeded") == 1
    redis_client.delete(engine.keys("default").counters)
    recorder.flush(engine, ["default"], now=now)  # the snapshot, taken now
    assert "snap:added" in store.minutes(engine, "default", minute, minute)[minute]
    assert store.totals(engine, ["default"])["default"].get("jobs:succeeded") == 1


@pytest.mark.cluster
def test_a_sharded_queues_outcomes_are_written_while_one_shards_master_is_down(on_lonely):
    """The Cluster case of the test above: a queue split into shards, the master of one
    of its shards down, the master of its own hash tag (its metrics keys) up. Its workers
    go on running the jobs of the other shards, and their outcomes must reach the scrape
    (the queue is marked unreadable, but not lost when the worker stops)."""
    from tests.test_audit_cls3 import PREFIX, node, owner, settings_for

    cluster, client = on_lonely
    queue = "s0"
    with override_settings(DELAYJOBS=settings_for(cluster, QUEUE_SHARDS={queue: 6})):
        engine = get_engine()
        home = owner(client, store.totals_key(engine, queue))
        away = {engine.node_of(shard) for shard in engine.shards(queue)} - {home}
        assert away, "every shard on one master"
        victim = node(cluster, sorted(away)[0])
        assert owner(client, f"{{{PREFIX}:{queue}}}:pending") == home
        recorder = Recorder()
        now = time.time()
        recorder.record(queue, result(Outcome.SUCCEEDED), now=now)
        cluster.kill(victim)
        try:
            with pytest.raises(EngineUnavailable):
                recorder.flush(engine, [queue], now=now)
            written = store.totals(engine, [queue])[queue]
        finally:
            cluster.restart(victim)
        assert written.get("jobs:succeeded") == 1


#: A process that serves the metrics port, uses up its file descriptors, prints the port,
#: waits for a line (a client has connected) and prints the CPU seconds of the next one.
OUT_OF_DESCRIPTORS = """
import os, resource, sys, time
import django
django.setup()
from django_delayjobs.metrics.server import MetricsServer
server = MetricsServer("127.0.0.1", 0).start()
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
held = []
try:
    while True:
        held.append(open(os.devnull))
except OSError:
    pass
print(server.port, flush=True)
sys.stdin.readline()
time.sleep(0.2)
cpu = time.process_time()
time.sleep(1.0)
print(time.process_time() - cpu, flush=True)
"""


def test_the_metrics_port_does_not_spin_when_the_process_is_out_of_file_descriptors():
    """A connection that the worker process cannot accept (no file descriptor left: an
    action that leaks them, a low ``ulimit -n``) stays pending, so the listening socket is
    ready again at once, and the port's thread retried the accept in a loop at a full
    core (0.94 CPU seconds a second), holding the GIL from the worker's threads, which
    then ran their jobs slower. It pauses between tries now."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    root = pathlib.Path(__file__).resolve().parent.parent
    command = [sys.executable, "-c", OUT_OF_DESCRIPTORS]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
    with subprocess.Popen(command, cwd=root, env=env, text=True, **pipes) as child:
        try:
            assert child.stdout is not None and child.stdin is not None
            port = int(child.stdout.readline())
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                child.stdin.write("connected\n")
                child.stdin.flush()
                cpu = float(child.stdout.readline())
        finally:
            child.kill()
    assert cpu < 0.3, f"{cpu:.2f} CPU seconds in 1 s"
