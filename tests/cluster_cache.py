"""A django-redis connection factory that makes ``redis.cluster.RedisCluster`` clients.

django-redis ships no cluster client (its tracker's cluster issues are open); its
``CONNECTION_FACTORY`` option is the documented way to plug one in. This is the factory
that docs/cluster.md shows, tested here as it is printed there.
"""

from __future__ import annotations

from typing import Any

from django_redis.pool import ConnectionFactory
from redis.cluster import RedisCluster


class ClusterConnectionFactory(ConnectionFactory):  # type: ignore[misc]
    """LOCATION is any node of the cluster; the client finds the others."""

    _clusters: dict[str, RedisCluster] = {}

    def connect(self, url: str) -> Any:
        if url not in self._clusters:
            # a socket timeout (redis-py 8 gives 5 s; earlier ones none, which the
            # worker refuses: a master that stops answering would hang it for good)
            self._clusters[url] = RedisCluster.from_url(url, socket_timeout=5)
        return self._clusters[url]

    def disconnect(self, connection: Any) -> None:
        connection.close()
