"""Where the engine tests run: one Redis, or the session's Redis Cluster (``-m cluster``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from django_delayjobs.engine import close_client
from tests.conftest import cluster_client


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
