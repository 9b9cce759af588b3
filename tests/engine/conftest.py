"""Where the engine tests run: one Redis, or the session's Redis Cluster (``-m cluster``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from django_delayjobs.engine import Engine, close_client
from tests.conftest import cluster_client

#: What ``Q`` of a test module becomes in the ``cluster-shard`` runs of ``engine``.
SHARD = "q#3/6"


@dataclass(frozen=True)
class Backend:
    name: str
    url: str
    cluster: bool

    def client(self, **kwargs: Any) -> Any:
        """A new client of this backend (the caller closes it)."""
        if self.cluster:
            return cluster_client(self.url, **kwargs)
        return redis.Redis.from_url(self.url, **kwargs)


def open_backend(request: pytest.FixtureRequest, name: str) -> Backend:
    if name.startswith("cluster"):
        cluster = request.getfixturevalue("redis_cluster")
        cluster.wait_healthy()
        return Backend(name, cluster.url, cluster=True)
    return Backend(name, request.getfixturevalue("redis_url"), cluster=False)


def on_cluster(name: str) -> Any:
    """A backend parameter that needs the cluster (so it carries the ``cluster`` mark)."""
    return pytest.param(name, marks=pytest.mark.cluster, id=name)


@pytest.fixture(params=["single", on_cluster("cluster"), on_cluster("cluster-shard")])
def backend(request: pytest.FixtureRequest) -> Backend:
    return open_backend(request, request.param)


@pytest.fixture(scope="session")
def session_clients() -> Iterator[dict[str, Any]]:
    """One client per backend URL for the session (see ``backend_client``)."""
    made: dict[str, Any] = {}
    yield made
    for client in made.values():
        close_client(client)


def flushed(client: Any, cluster: bool) -> Any:
    """``client``, whatever the test before did with it, with its database flushed.

    A Cluster client reads the slot table anew: it follows a failover or a slot an earlier
    test moved, and gets back the default node that ``close()`` drops (without it, every
    command sent to that node fails). A closed pool reconnects on demand.
    """
    if cluster:
        client.nodes_manager.initialize()
    client.flushdb()
    return client


@pytest.fixture
def backend_client(backend: Backend, session_clients: dict[str, Any]) -> Iterator[Any]:
    """The session's client of ``backend``, flushed (on a Cluster: every master).

    Kept for the session: a new ``RedisCluster`` reads the cluster's slot and command
    tables, 20 ms that every cluster test paid. Closed after each test, so that
    no connection a test left waiting (a thread's ``BLPOP``) reaches into the next.
    """
    if backend.url not in session_clients:
        session_clients[backend.url] = backend.client()
    client = flushed(session_clients[backend.url], backend.cluster)
    yield client
    close_client(client)


@pytest.fixture
def engine(
    backend: Backend, backend_client: Any, request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Engine]:  # fmt: skip
    """An engine of ``backend``, closed at the end so that no wait of the test outlives it
    (see waiting.py). On ``cluster-shard``, the test module's ``Q`` is ``SHARD``, one shard
    (its own hash tag, in the slot range of the second master) of a queue of 6."""
    if backend.name == "cluster-shard":
        monkeypatch.setattr(request.module, "Q", SHARD)
        engine = Engine(backend_client, prefix="t", shards={"q": 6})
    else:
        engine = Engine(backend_client, prefix="t")
    yield engine
    engine.close()
