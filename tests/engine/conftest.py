"""Where the engine tests run: one Redis, or the session's Redis Cluster (``-m cluster``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import redis

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
