"""The process's engine, built lazily from settings and dropped when they change."""

from __future__ import annotations

import re
import threading
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from django.core.cache.backends.base import InvalidCacheBackendError
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.retry import Retry

from .conf import delayjobs_settings
from .engine import Engine, EngineUnavailable
from .exceptions import ConfigurationError
from .redact import url_problem, without_userinfo

#: Every command is answered in well under a millisecond unless Redis is frozen or gone; a
#: caller (``schedule()`` committing, say) must then not wait for long. Blocking waits are
#: kept below the read timeout by the engine. No retries inside redis-py: each caller has
#: its own answer to a failed call (reconcile, the lease, a loop's backoff).
SOCKET_TIMEOUT = 1.0
CONNECT_TIMEOUT = 1.0
#: On a Cluster, one retry: the first command after a failover meets a closed connection
#: to the old master, after which redis-py has read the new slot table and the retry goes
#: to the new one. (MOVED and ASK redirections are followed within a command, at most 16.)
CLUSTER_RETRIES = 1
#: The longest socket timeout a ``REDIS_URL`` may give: past a day it is a slip of the
#: keyboard (and past about 1e10 s the first connect fails with ``OverflowError``).
MAX_URL_TIMEOUT = 86_400.0
#: A database path redis-py reads: none, ``/`` or ``/<number>``.
_DB_PATH = re.compile(r"/?(?:[0-9]+)?", re.ASCII)

_lock = threading.Lock()
_engine: Engine | None = None


def redis_client() -> Any:
    """Return a Redis client for ``CACHE_ALIAS`` (django-redis) or ``REDIS_URL``: a
    ``RedisCluster`` when ``REDIS_CLUSTER`` is on, else a ``Redis``. Settings that cannot
    give one raise ``ConfigurationError`` (an ``ImproperlyConfigured`` and a
    ``DelayJobsError``, which the commands and views report in one line)."""
    alias = delayjobs_settings.CACHE_ALIAS
    if alias:
        return cache_client(alias)
    if delayjobs_settings.REDIS_CLUSTER:
        return cluster_client(delayjobs_settings.REDIS_URL)
    problem = redis_url_problem(delayjobs_settings.REDIS_URL)
    if problem:
        raise ConfigurationError(f"DELAYJOBS['REDIS_URL'] {problem}")
    return redis.Redis.from_url(
        delayjobs_settings.REDIS_URL,
        socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=CONNECT_TIMEOUT,
        health_check_interval=30,
        retry=Retry(NoBackoff(), 0),
    )


def cache_client(alias: str) -> Any:
    try:
        from django_redis import get_redis_connection
    except ImportError as exc:  # pragma: no cover - django-redis is a dependency
        raise ConfigurationError("CACHE_ALIAS needs django-redis") from exc
    try:
        client = get_redis_connection(alias)
    except InvalidCacheBackendError as exc:  # check E007, which a web process does not run
        raise ConfigurationError(f"DELAYJOBS['CACHE_ALIAS'] = {alias!r} is not in CACHES") from exc
    except NotImplementedError as exc:
        raise ConfigurationError(
            f"DELAYJOBS['CACHE_ALIAS'] = {alias!r} is not a django-redis cache"
        ) from exc
    from redis.cluster import RedisCluster

    if delayjobs_settings.REDIS_CLUSTER and not isinstance(client, RedisCluster):
        raise ConfigurationError(
            f"DELAYJOBS['REDIS_CLUSTER'] is on but the cache {alias!r} gives a "
            f"{type(client).__name__}, not a redis.cluster.RedisCluster: django-redis has no "
            "cluster client of its own; give the cache a CONNECTION_FACTORY that makes one "
            "(docs/cluster.md), or use REDIS_URL"
        )
    if isinstance(client, RedisCluster) and not delayjobs_settings.REDIS_CLUSTER:
        raise ConfigurationError(
            f"the cache {alias!r} is a Redis Cluster client: set DELAYJOBS['REDIS_CLUSTER'] = True"
        )
    return client


def redis_url_problem(url: str) -> str | None:
    """What keeps redis-py from using ``url`` (parsed as it parses it, nothing connected),
    or None; in words that show no part of a password (check E016)."""
    problem = url_problem(url)
    if problem:
        return f"is not a valid URL ({problem})"
    try:
        options = redis.connection.parse_url(url)  # type: ignore[no-untyped-call]
        # Built, not connected: a query name no connection takes (TypeError at the first
        # command, in a worker thread), a max_connections below 0, a protocol not 2 or 3.
        redis.ConnectionPool.from_url(url).make_connection()
    except (TypeError, ValueError, redis.RedisError) as exc:  # ValueError: its scheme too
        return f"cannot be used by redis-py: {exc}"
    return options_problem(url, options)


def options_problem(url: str, options: dict[str, Any]) -> str | None:
    """What redis-py takes from ``url`` without a word but cannot use, or None: a port 0
    or a database path that is not a number, which it drops (for 6379 and database 0,
    perhaps another application's), a database below 0, and socket timeouts that fail
    the first connect (``nan``, ``0``: non-blocking, below 0, ``1e400``)."""
    parts = urlsplit(url)
    if parts.scheme != "unix":
        if parts.port == 0:
            return "names port 0 (redis-py would connect to port 6379)"
        path = unquote(parts.path)
        if _DB_PATH.fullmatch(path) is None:
            return f"names database {path!r}: give a number (redis-py would use database 0)"
        if path.strip("/") and "db" in parse_qs(parts.query):
            return "names its database twice, in its path and in db="
    if options.get("db", 0) < 0:
        return f"names database {options['db']}: databases are numbered from 0"
    for name in ("socket_timeout", "socket_connect_timeout"):
        value = options.get(name)
        if value is not None and not 0 < value <= MAX_URL_TIMEOUT:
            return f"gives {name}={value}: give from more than 0 to {MAX_URL_TIMEOUT:g} seconds"
    return None


def cluster_url_problem(url: str) -> str | None:
    """What keeps ``url`` from naming a Cluster node, or None. The text shows ``url``
    without its user information (a password must not reach ``manage.py check``)."""
    shown = without_userinfo(url)
    problem = url_problem(url)
    if problem:
        return f"{shown!r} is not a valid URL ({problem})"
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        return f"{shown!r} is not a redis:// or rediss:// URL (a Cluster is reached over TCP)"
    if not parts.hostname:
        return f"{shown!r} names no host"
    if parts.path.strip("/") not in ("", "0") or "db=" in parts.query:
        return f"{shown!r} names a database other than 0 (a Cluster has only database 0)"
    try:
        problem = options_problem(url, redis.connection.parse_url(url))  # type: ignore[no-untyped-call]
    except ValueError as exc:  # a bad query value
        problem = f"cannot be used by redis-py: {exc}"
    return f"{shown!r} {problem}" if problem else None


def cluster_client(url: str) -> Any:
    """A ``RedisCluster`` seeded with ``url``; it reads the slot table from that node."""
    from redis.cluster import RedisCluster

    problem = cluster_url_problem(url)
    if problem:
        raise ConfigurationError(f"DELAYJOBS['REDIS_URL'] {problem}")
    try:
        return RedisCluster.from_url(
            url,
            socket_timeout=SOCKET_TIMEOUT,
            socket_connect_timeout=CONNECT_TIMEOUT,
            health_check_interval=30,
            retry=Retry(ExponentialWithJitterBackoff(cap=0.5, base=0.05), CLUSTER_RETRIES),
        )
    except Exception as exc:  # nothing reachable, not a cluster, no slot table...
        where = urlsplit(url)
        raise EngineUnavailable(
            f"cannot reach a Redis Cluster at {where.hostname}:{where.port or 6379}: {exc}"
        ) from exc


def get_engine() -> Engine:
    """Return the shared engine (thread-safe; redis-py's pool serves all threads)."""
    global _engine
    if _engine is None:
        with _lock:
            if _engine is None:
                _engine = Engine(
                    redis_client(),
                    prefix=delayjobs_settings.PREFIX,
                    shards=delayjobs_settings.QUEUE_SHARDS,
                )
    return _engine


def reset_engine() -> None:
    """Forget the shared engine, closing its connections and waits (settings changed)."""
    global _engine
    with _lock:
        if _engine is not None:
            _engine.close()
        _engine = None
