"""The process's engine, built lazily from settings and dropped when they change."""

from __future__ import annotations

import threading

import redis
from django.core.exceptions import ImproperlyConfigured

from .conf import delayjobs_settings
from .engine import Engine

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
        socket_connect_timeout=5,
        health_check_interval=30,
        retry_on_timeout=False,
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
