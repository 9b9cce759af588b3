"""The process's engine, built lazily from settings and dropped when they change."""

from __future__ import annotations

import threading

import redis
from django.core.exceptions import ImproperlyConfigured
from redis.backoff import NoBackoff
from redis.retry import Retry

from .conf import delayjobs_settings
from .engine import Engine

#: Every command is answered in well under a millisecond unless Redis is frozen or gone; a
#: caller (``schedule()`` committing, say) must then not wait for long. Blocking waits are
#: kept below the read timeout by the engine. No retries inside redis-py: each caller has
#: its own answer to a failed call (reconcile, the lease, a loop's backoff).
SOCKET_TIMEOUT = 1.0
CONNECT_TIMEOUT = 1.0

_lock = threading.Lock()
_engine: Engine | None = None


def redis_client() -> redis.Redis:
    """Return a Redis client for ``CACHE_ALIAS`` (django-redis) or ``REDIS_URL``."""
    alias = delayjobs_settings.CACHE_ALIAS
    if alias:
        try:
            from django_redis import get_redis_connection
        except ImportError as exc:  # pragma: no cover - django-redis is a dependency
            raise ImproperlyConfigured("CACHE_ALIAS needs django-redis") from exc
        try:
            return get_redis_connection(alias)  # type: ignore[no-any-return]
        except NotImplementedError as exc:
            raise ImproperlyConfigured(
                f"DELAYJOBS['CACHE_ALIAS'] = {alias!r} is not a django-redis cache"
            ) from exc
    return redis.Redis.from_url(
        delayjobs_settings.REDIS_URL,
        socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=CONNECT_TIMEOUT,
        health_check_interval=30,
        retry=Retry(NoBackoff(), 0),
    )


def get_engine() -> Engine:
    """Return the shared engine (thread-safe; redis-py's pool serves all threads)."""
    global _engine
    if _engine is None:
        with _lock:
            if _engine is None:
                _engine = Engine(redis_client(), prefix=delayjobs_settings.PREFIX)
    return _engine


def reset_engine() -> None:
    """Forget the shared engine, closing its connections (settings changed)."""
    global _engine
    with _lock:
        if _engine is not None:
            _engine.client.close()
        _engine = None
