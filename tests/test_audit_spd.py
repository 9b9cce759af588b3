"""Audit of the test suite's speed: what the faster fixtures must still guarantee."""

from __future__ import annotations

from typing import Any

import pytest

from django_delayjobs.engine import Engine, close_client
from tests.engine.conftest import Backend, flushed, on_cluster, open_backend


@pytest.fixture(params=["single", on_cluster("cluster")])
def backend(request: pytest.FixtureRequest) -> Backend:
    return open_backend(request, request.param)


def test_a_shared_client_that_a_test_closed_serves_the_next_test_flushed(backend: Backend) -> None:
    """The engine tests share one client per backend: one test's leftovers (keys, its
    engine closed, which on a Cluster drops the client's default node) reach no other."""
    client: Any = backend.client()
    try:
        engine = Engine(client, prefix="t")
        engine.add("q", {"a": 0})
        engine.close()
        engine = Engine(flushed(client, backend.cluster), prefix="t")
        assert engine.server_time_ms() > 0
        assert engine.known_queues() == []
        assert client.keys("*") == []
    finally:
        close_client(client)
