"""Start-up checks of the Redis a worker is about to use."""

from __future__ import annotations

import logging
import re
from typing import Any

from django.db import transaction

from .conf import delayjobs_settings
from .engine import Engine
from .engine.waiting import socket_timeout
from .exceptions import ConfigurationError

logger = logging.getLogger("django_delayjobs.worker")

#: LPOP with a count (claim.lua) arrived in Redis 6.2.
MIN_REDIS = (6, 2)


def describe_redis(engine: Engine) -> str:
    """Return where the engine connects, without a password."""
    if engine.is_cluster:
        seed = engine.client.get_default_node()
        masters = len(engine.client.get_primaries())
        return f"redis://{seed.host}:{seed.port} (cluster, {masters} masters)"
    kwargs = engine.client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']} db {kwargs.get('db', 0)}"
    return f"redis://{kwargs.get('host')}:{kwargs.get('port')}/{kwargs.get('db', 0)}"


def redis_version(info: dict[str, Any], where: str = "") -> tuple[int, int]:
    """The (major, minor) of an ``INFO`` reply's ``redis_version`` (``7.2.4``, or a
    compatible server's ``7.2.4-rc1``); ``ConfigurationError`` if it gives none."""
    found = re.match(r"(\d+)\.(\d+)", str(info.get("redis_version", "")))
    if found is None:
        raise ConfigurationError(
            f"cannot read the version of the Redis server{where} "
            f"(redis_version: {info.get('redis_version')!r}): django-delayjobs needs 6.2 or later"
        )
    return int(found[1]), int(found[2])


def check_redis(engine: Engine) -> list[str]:
    """Raise ``EngineUnavailable``/``ConfigurationError`` if Redis cannot serve; return
    warnings. On a Cluster every master is checked (each holds some queues' keys)."""
    warnings = []
    for address, info in engine.masters().items():
        where = f" (master {address})" if address else ""
        if redis_version(info, where) < MIN_REDIS:
            raise ConfigurationError(
                f"Redis {info['redis_version']}{where} is too old: django-delayjobs needs "
                "6.2 or later"
            )
        policy = info.get("maxmemory_policy", "noeviction")
        if policy != "noeviction":
            message = (
                f"Redis maxmemory-policy is {policy!r}{where}: when memory runs out Redis may "
                "evict queue keys and jobs will only run again after a reconcile sweep; set "
                "it to 'noeviction'"
            )
            if delayjobs_settings.REFUSE_EVICTING_REDIS:
                raise ConfigurationError(message + " (REFUSE_EVICTING_REDIS is on)")
            warnings.append(message)
    return warnings


def pool_limit(client: Any) -> int | None:
    """The most connections ``client`` opens to one Redis at once (None: no cap given)."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        limit = getattr(pool, "max_connections", None)
    else:  # a RedisCluster: each master's pool is made with its connection kwargs
        manager = getattr(client, "nodes_manager", None)
        limit = (getattr(manager, "connection_kwargs", None) or {}).get("max_connections")
    return limit if isinstance(limit, int) and not isinstance(limit, bool) else None


def check_pool(engine: Engine, threads: int) -> None:
    """Raise ``ConfigurationError`` if the client's connection pool cannot give each of
    ``threads`` threads a connection at once: every thread of a worker may hold one at the
    same moment (the worker threads and the promoter wait on Redis for up to half a second
    at a time), and each call beyond the cap fails with "Too many connections" (or waits
    for a connection), so the promoter and the workers would back off in turn and a
    process that looks alive would run next to nothing."""
    limit = pool_limit(engine.client)
    if limit is not None and limit < threads:
        raise ConfigurationError(
            f"the Redis connection pool opens at most {limit} connections (max_connections), "
            f"but this worker has {threads} threads that use Redis at once: the others "
            "would fail with 'Too many connections' and stall. Allow at least that many "
            "(the ?max_connections= of REDIS_URL, or the CONNECTION_POOL_KWARGS of the "
            "CACHE_ALIAS cache), or lower --concurrency"
        )


def check_socket_timeout(engine: Engine, what: str = "every thread of this worker") -> None:
    """Raise ``ConfigurationError`` if the client's connections have no socket timeout:
    a Redis that stops answering (frozen, or cut off by the network with no reset) would
    hold ``what`` in a read for good (every thread of a worker, the process up all the
    while)."""
    if socket_timeout(engine.client) is None:
        raise ConfigurationError(
            "the Redis client has no socket timeout: a Redis that stops answering would "
            f"hang {what} for good. Give it one, 1 to 5 s (the "
            "SOCKET_TIMEOUT of the CACHE_ALIAS cache's OPTIONS, or socket_timeout in its "
            "CONNECTION_POOL_KWARGS)"
        )


def deployment_uid() -> str:
    """This database's deployment id (created by the first worker that asks)."""
    from .models import Deployment

    # Read first, outside a transaction: the housekeeping thread asks at every beat, and on
    # SQLite a transaction (BEGIN IMMEDIATE) would wait for the write lock that a running
    # atomic action holds, delaying the lease extensions and MAX_RUN_SECONDS checks.
    deployment = Deployment.objects.filter(pk=1).first()
    if deployment is None:
        with transaction.atomic(using=Deployment.objects.db):
            deployment, _ = Deployment.objects.get_or_create(pk=1)
    return str(deployment.uid)


def check_owner(engine: Engine, mine: str | None = None) -> None:
    """Raise ``ConfigurationError`` if another deployment's workers use this Redis database
    and ``PREFIX``: each would take the other's ids, find no row, and drop them. ``mine``:
    this deployment's id, if read already (``deployment_uid``)."""
    mine = mine or deployment_uid()
    recorded = engine.claim_owner(mine)
    if recorded != mine:
        raise ConfigurationError(
            f"Redis {describe_redis(engine)} with DELAYJOBS['PREFIX'] = {engine.prefix!r} "
            f"holds the jobs of another deployment (another database: deployment {recorded}; "
            f"this one is {mine}). Give each deployment its own PREFIX or Redis database. If "
            f"that other deployment is gone for good, delete the key {engine.owner_key!r}."
        )
