"""The promoter, timing and waiting: a job is promoted on time, never early, and no queue
waits behind another's backlog (audit of promoter.py, engine/waiting.py and their scripts).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from django_redis.pool import ConnectionFactory
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_delayjobs.engine import Engine, EngineUnavailable, close_client
from django_delayjobs.management.commands import run_delayworker
from django_delayjobs.promoter import Promoter
from django_delayjobs.worker import Options, WorkerProcess
from tests.conftest import cluster_client
from tests.helpers import ROOT, add_pending, run_on_two_databases, wait_for, worker_env


@pytest.fixture
def batch_of_10() -> Iterator[None]:
    with override_settings(DELAYJOBS={**settings.DELAYJOBS, "BATCH_SIZE": 10}):
        yield


@pytest.fixture
def batch_of_1() -> Iterator[None]:
    with override_settings(DELAYJOBS={**settings.DELAYJOBS, "BATCH_SIZE": 1}):
        yield


def counting_timeouts(client: redis.Redis) -> list[float]:
    """Make ``client``'s new connections note each reply that did not come within its
    socket timeout; return the list they note it in (a real connection, instrumented)."""
    timeouts: list[float] = []
    pool = client.connection_pool

    class Counting(pool.connection_class):  # type: ignore[name-defined,misc]
        def read_response(self, *args: object, **kwargs: object) -> object:
            try:
                return super().read_response(*args, **kwargs)
            except redis.TimeoutError:
                timeouts.append(time.monotonic())
                raise

    pool.connection_class = Counting
    return timeouts


def backlog(engine: Engine, queue: str, count: int) -> float:
    """Put ``count`` ids in ``queue``'s pending set, all due by the time this returns (an
    add of an id already due would put it in ready at once); return their due time."""
    due = add_pending(engine, queue, [f"{queue}-{n:06d}" for n in range(count)], 50)
    while engine.server_time_ms() <= due:
        time.sleep(0.005)
    return due


def evalsha_order(client: redis.Redis, run: object) -> list[str]:
    """The first key of every script call Redis ran during ``run()``, in order (read
    from the slow log, which records every command while its threshold is 0)."""
    old = client.config_get("slowlog-*")
    client.config_set("slowlog-max-len", 100_000)
    client.config_set("slowlog-log-slower-than", 0)
    client.slowlog_reset()
    try:
        run()  # type: ignore[operator]
        entries = client.slowlog_get(100_000)
    finally:
        for name, value in old.items():
            client.config_set(name, value)
        client.slowlog_reset()
    keys = []
    for entry in reversed(entries):  # newest first
        command = entry["command"].split()
        if command and command[0].upper() == b"EVALSHA":
            keys.append(command[3].decode())
    return keys


def test_a_backlog_in_one_queue_does_not_hold_up_promotion_in_another(
    engine, redis_client, batch_of_10
):
    """A pass promoted a shard until it had nothing due before it looked at the next: a
    backlog of due ids in one queue (100k due at midnight take about 0.25 s at batch
    1000, a million 2.5 s) held back every due job of the queues after it, and the lease
    recovery of all, for as long as it took to drain. Shards now take turns, one batch
    each per round."""
    backlog(engine, "a", 500)
    add_pending(engine, "b", ["b-1"], 20)
    while not engine.stats("b").overdue:
        time.sleep(0.005)
    promoter = Promoter(engine, ["a", "b"], tick=1.0)
    order = evalsha_order(redis_client, promoter.step)
    promotes = [key for key in order if key.endswith(":pending")]
    assert engine.stats("a").ready == 500 and engine.stats("b").ready == 1
    first_b = promotes.index(engine.keys("b").pending)
    assert first_b <= 2, f"queue b was first promoted after {first_b} calls on queue a"


def test_the_wait_after_a_long_pass_counts_from_the_end_of_the_pass(engine, batch_of_1):
    """The time until a shard's next due id was measured when that shard was promoted,
    and the promoter slept that long after the whole pass: every ms the pass spent on the
    shards after it (a backlog) made that job as late."""
    backlog(engine, "b", 4000)  # 4,000 calls: a pass of 0.1 s or more
    server_ms, local = engine.server_time_ms(), time.monotonic()
    due_ms = server_ms + 3000  # after the pass, however loaded the machine (0.95 s seen)
    engine.add("a", {"a-1": due_ms})
    promoter = Promoter(engine, ["a", "b"], tick=5.0)
    wait = promoter.step()
    woken = time.monotonic() + wait
    assert engine.stats("b").ready == 4000
    assert 0.05 < time.monotonic() - local < 2.9, "the pass cannot show the delay"
    late_ms = (woken - local) * 1000 - (due_ms - server_ms)
    assert late_ms < 5, f"the promoter would wake {late_ms:.0f} ms after the job is due"


def test_a_job_that_falls_due_during_a_long_pass_is_promoted_in_it(engine, batch_of_1):
    """A shard was promoted once per pass (more only while it had a whole batch due): a
    job that fell due while the pass drained another shard's backlog waited for the pass
    to end. A shard whose next id is due takes its turn again."""
    backlog(engine, "b", 4000)  # 4,000 calls: a pass of 0.1 s or more
    local = time.monotonic()
    engine.add("a", {"a-1": engine.server_time_ms() + 20})
    Promoter(engine, ["a", "b"], tick=1.0).step()
    assert time.monotonic() - local > 0.05, "the pass was too short to show anything"
    assert engine.stats("a").ready == 1


@pytest.mark.django_db(transaction=True)
def test_a_connection_pool_smaller_than_the_workers_threads_is_refused_with_one_line(redis_url):
    """Each thread of a worker holds a connection while it waits on Redis (the worker
    threads and the promoter for up to half a second at a time). A pool capped below the
    threads that use it (``?max_connections=`` in REDIS_URL, or a django-redis cache's
    CONNECTION_POOL_KWARGS) made every other call fail with "Too many connections": the
    promoter backed off up to 5 s, one job of 20 ran in 10 s, and the process looked
    alive. It is refused at start, with what to change."""
    env = worker_env(redis_url + "?max_connections=4")
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "django", "run_delayworker", "--settings", "tests.settings",
         "--skip-checks", "--concurrency", "4"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=20,
    )  # fmt: skip
    assert run.returncode == 1 and time.monotonic() - started < 30
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("CommandError: ") and "max_connections" in line and " 8 " in line


def test_a_wait_on_a_client_with_a_very_short_socket_timeout_neither_fails_nor_spins(redis_url):
    """Redis answers a blocking pop that timed out on its next tick, up to 100 ms late
    (hz 10). A client whose socket timeout is shorter than that (a django-redis cache with
    ``SOCKET_TIMEOUT`` 0.1, given as CACHE_ALIAS) saw its waits fail with a read timeout
    about half the time: each one an 'unavailable Redis' to the worker and the promoter,
    which backed off and reconnected, with jobs late by the backoff. Such a client polls
    the token lists instead."""
    client = redis.Redis.from_url(redis_url, socket_timeout=0.05, retry=Retry(NoBackoff(), 0))
    try:
        engine = Engine(client, prefix="t")
        for _ in range(10):
            started = time.monotonic()
            assert engine.wait_for_work(["q"], 0.1) is False
            assert time.monotonic() - started >= 0.01  # it waited: a loop around it does not spin
        engine.add("q", {"a": 0})
        assert engine.wait_for_work(["q"], 0.2) is True
        due = engine.server_time_ms() + 100
        engine.add("q", {"b": due})  # the earliest pending id: a wake token
        assert engine.wait_for_wake(["q"], 0.2) is True
        client.set(engine.keys("broken").notify, "x")  # another program's: passed over
        assert engine.wait_for_work(["broken", "q"], 0.1) is False
    finally:
        close_client(client)


@pytest.mark.django_db(transaction=True)
def test_a_client_without_a_socket_timeout_is_refused_at_start(redis_url, settings,
                                                               monkeypatch):  # fmt: skip
    """A client with no socket timeout (a django-redis cache given as CACHE_ALIAS whose
    pool has ``socket_timeout`` None, as redis-py before 8 gives by default) waits for
    ever on a Redis that stops answering (frozen, or cut off with no reset): every thread
    of the worker would hang in a read for good, with the process up to its supervisor.
    ``run_delayworker`` refuses it at start, in one line."""
    settings.CACHES = {
        **settings.CACHES,
        "jobs": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_url,
                 "OPTIONS": {"CONNECTION_POOL_KWARGS": {"socket_timeout": None}}},
    }  # fmt: skip
    settings.DELAYJOBS = {**settings.DELAYJOBS, "CACHE_ALIAS": "jobs"}
    # django-redis keeps one pool per URL for the process: one an earlier test made for
    # this Redis (with a timeout) would be given to this cache
    monkeypatch.setattr(ConnectionFactory, "_pools", {})
    command = run_delayworker.Command()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            call_command(command, verbosity=0)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(5)
    if thread.is_alive():  # it started: stop it, and fail
        while command.process is None:
            time.sleep(0.01)
        command.process.stop()
        thread.join(30)
    assert errors and isinstance(errors[0], CommandError), "the worker started"
    assert "socket timeout" in str(errors[0]) and "SOCKET_TIMEOUT" in str(errors[0])


def test_a_pass_of_the_promoter_on_a_frozen_redis_waits_for_it_once(own_redis):
    """On one Redis that does not answer, a pass of the promoter waited for the read
    timeout at every call: the queue directory's read (which fell back to the last
    listing), then each queue's lease recovery, listing and promotion; three queues took
    ten timeouts for the first pass and six for each one after. One timeout ends the pass:
    every other call would wait for the same one. So do a worker's claim over three
    queues (it waited for three), and a read of the queue state or a claim by a fresh
    engine (they waited for two, the directory's and their own, once per
    ``DIRECTORY_TTL``)."""
    client = redis.Redis.from_url(
        own_redis.url, socket_timeout=0.3, socket_connect_timeout=0.3, retry=Retry(NoBackoff(), 0)
    )
    timeouts = counting_timeouts(client)
    queues = ["a", "b", "c"]
    engine = Engine(client, prefix="t")
    promoter = Promoter(engine, queues, tick=1.0)
    process = WorkerProcess(engine, Options(queues))
    try:
        promoter.step()  # the directory is read: the passes below use what it listed
        assert own_redis.pid is not None
        os.kill(own_redis.pid, signal.SIGSTOP)
        calls = [promoter.step] * 3 + [
            lambda: process.claim(queues),
            lambda: Engine(client, prefix="t").stats("a"),
            lambda: Engine(client, prefix="t").claim("a", 1, 60_000),
            lambda: Promoter(Engine(client, prefix="t"), queues).step(),
        ]
        for call in calls:
            timeouts.clear()
            with pytest.raises(EngineUnavailable):
                call()
            assert len(timeouts) == 1, call
    finally:
        close_client(client)


def test_a_wait_outlasted_by_a_stall_shorter_than_the_socket_timeout_is_no_outage(own_redis):
    """A wait blocks in Redis for up to the socket timeout less half a second (0.5 s of
    the default 1 s), so Redis had that half second, not the whole timeout, to answer
    once the wait ended. A Redis that stalls (busy with another client's slow command, a
    fork, a starved host) for 0.7 s around that moment answers every other command in time,
    yet the wait failed with a read timeout: "Redis is unavailable" to the promoter and the
    worker, which backed off. A wait whose reply is late is no token, not an outage; a
    Redis that is really frozen fails the caller's next call."""
    assert own_redis.pid is not None
    client = redis.Redis.from_url(own_redis.url, socket_timeout=1.0, retry=Retry(NoBackoff(), 0))
    watcher = redis.Redis.from_url(own_redis.url, socket_timeout=5.0)
    engine = Engine(client, prefix="t")
    try:
        for _ in range(3):
            # A command sent as the stall begins is answered within its timeout.
            outcome = stall_around_a_wait(engine, watcher, own_redis.pid, also=client.ping)
            assert sorted(outcome, key=str) == [False, True], outcome
        with pytest.raises(EngineUnavailable):  # frozen for good: the next call says so
            os.kill(own_redis.pid, signal.SIGSTOP)
            engine.wait_for_wake(["q"], 0.2)
            engine.promote("q")
    finally:
        os.kill(own_redis.pid, signal.SIGCONT)
        close_client(client)
        close_client(watcher)


@pytest.mark.cluster
def test_a_doorbell_outlasted_by_a_stall_shorter_than_the_socket_timeout_is_no_outage(lonely):
    """The same on a Cluster: a doorbell's pop blocks for the socket timeout less half a
    second, and a master that stalled 0.7 s around its end failed every wait on it."""
    lonely.wait_healthy()
    client = cluster_client(lonely.url, socket_timeout=1.0, socket_connect_timeout=1.0)
    engine = Engine(client, prefix="t")
    master = next(n for n in lonely.nodes if n.address == engine.node_of("q"))
    watcher = master.client()
    assert master.pid is not None
    try:
        for _ in range(3):
            outcome = stall_around_a_wait(engine, watcher, master.pid)
            assert outcome == [False], outcome
    finally:
        os.kill(master.pid, signal.SIGCONT)
        engine.close()
        watcher.close()


def stall_around_a_wait(
    engine: Engine, watcher: redis.Redis, pid: int, also: Callable[[], object] | None = None
) -> list[object]:
    """Stop the Redis ``pid`` for 0.7 s from 0.1 s before the end of a wait on queue
    ``q`` (``watcher`` sees it blocked), calling ``also`` in a thread as the stall begins;
    return what the wait (and ``also``) returned or raised, in the order they ended."""
    outcome: list[object] = []

    def run(call: Callable[[], object]) -> None:
        try:
            outcome.append(call())
        except EngineUnavailable as exc:
            outcome.append(exc)

    threads = [threading.Thread(target=run, args=(lambda: engine.wait_for_wake(["q"], 3.0),))]
    threads[0].start()
    wait_for(lambda: watcher.info("clients")["blocked_clients"] == 1, timeout=10)
    time.sleep(0.4)  # then Redis stalls, before the wait ends (0.5 s)
    os.kill(pid, signal.SIGSTOP)
    if also is not None:
        threads.append(threading.Thread(target=run, args=(also,)))
        threads[1].start()
    time.sleep(0.7)
    os.kill(pid, signal.SIGCONT)
    for thread in threads:
        thread.join(10)
    wait_for(lambda: watcher.info("clients")["blocked_clients"] == 0, timeout=10)
    return outcome


#: With the jobs on a database of their own that is down: the worker's line for it (its
#: owner check, the read an idle worker makes) and the API's answer and log line.
WORKER_AND_API_JOBS_DOWN = """
import io
import json
import logging

import django

django.setup()
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.test.utils import setup_test_environment

from django_delayjobs.connection import get_engine
from django_delayjobs.worker import Options, WorkerProcess

call_command("migrate", verbosity=0)
log = io.StringIO()
logging.getLogger("django_delayjobs").addHandler(logging.StreamHandler(log))
WorkerProcess(get_engine(), Options(["default"])).check_owner()
worker = log.getvalue()
setup_test_environment()
client = Client(raise_request_exception=False)
client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw"))
answer = client.get("/api/delayjobs/jobs/")
print(json.dumps({"worker": worker, "status": answer.status_code,
                  "body": answer.content.decode(), "api": log.getvalue()[len(worker):]}))
"""


def test_the_worker_and_the_api_name_the_jobs_database_that_is_down(redis_url, tmp_path):
    """The jobs may live on a database of their own, down while the project's answers. The
    commands and the admin name it, but the worker logged "the database is unavailable"
    and the API answered so: an operator looked at the project's database, which
    answered."""
    said = run_on_two_databases(WORKER_AND_API_JOBS_DOWN, redis_url, tmp_path)
    assert said["worker"].startswith("worker: the jobs database 'jobs' is unavailable"), said
    assert "unable to open database file" in said["worker"], said
    assert said["status"] == 503, said
    assert json.loads(said["body"]) == {
        "detail": "The jobs database 'jobs' is unavailable; try again later."
    }
    assert "the jobs database 'jobs' is unavailable: unable to open" in said["api"], said


#: The jobs' database up, the project's down once the user has logged in: the API reads
#: the session's user from the project's.
API_PROJECT_DOWN = """
import json

import django

django.setup()
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connections
from django.test import Client
from django.test.utils import setup_test_environment

for alias in connections:
    call_command("migrate", database=alias, verbosity=0)
setup_test_environment()
client = Client(raise_request_exception=False)
client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw"))
connections["default"].close()
connections["default"].settings_dict["NAME"] = "/nonexistent/default.sqlite3"
answer = client.get("/api/delayjobs/jobs/")
print(json.dumps([answer.status_code, answer.content.decode()]))
"""


def test_the_api_does_not_blame_the_jobs_database_for_the_projects(redis_url, tmp_path):
    """The project's database down, the jobs' up: the 503 does not send the operator to
    the jobs' database."""
    status, body = run_on_two_databases(API_PROJECT_DOWN, redis_url, tmp_path, jobs_down=False)
    assert status == 503, body
    assert json.loads(body) == {"detail": "The database is unavailable; try again later."}
