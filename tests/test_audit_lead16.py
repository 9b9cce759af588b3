"""Audit lead16: a web process whose Redis client has no socket timeout is warned of by
``manage.py check`` (``django_delayjobs.W005``). The worker, the health check and
``delayjobs_stats`` refuse such a client, but a web process has no start-up of its own:
its ``schedule()`` (the push on commit), admin pages, API and metrics would wait for good
on a Redis that stops answering, the process up all the while."""

from __future__ import annotations

from typing import Any

import pytest
from django.core import checks
from django_redis.pool import ConnectionFactory

from django_delayjobs.connection import reset_engine
from django_delayjobs.embedded import EmbeddedRedis

from .test_audit_hlt2 import timeless_cache  # noqa: F401 (the fixture)


def w005() -> list[checks.CheckMessage]:
    return [m for m in checks.run_checks() if m.id == "django_delayjobs.W005"]


def test_a_cache_alias_without_a_socket_timeout_is_warned_of(
    timeless_cache: EmbeddedRedis,  # noqa: F811 (the fixture)
) -> None:
    [message] = w005()
    assert message.level == checks.WARNING
    assert "'jobs'" in message.msg and "socket timeout" in message.msg, message.msg
    assert "SOCKET_TIMEOUT" in (message.hint or ""), message.hint


@pytest.mark.parametrize("options", [{"SOCKET_TIMEOUT": 2}, {}])
def test_a_cache_alias_with_a_socket_timeout_is_not(
    own_redis: EmbeddedRedis, settings: Any, monkeypatch: Any, options: dict[str, Any]
) -> None:
    """With SOCKET_TIMEOUT, or with none given (redis-py 8 then applies its 5 s)."""
    settings.CACHES = {
        **settings.CACHES,
        "jobs": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": own_redis.url,
                 "OPTIONS": options},
    }  # fmt: skip
    settings.DELAYJOBS = {**settings.DELAYJOBS, "CACHE_ALIAS": "jobs"}
    monkeypatch.setattr(ConnectionFactory, "_pools", {})
    reset_engine()
    assert w005() == []


def test_a_cache_alias_that_cannot_give_a_client_is_left_to_the_other_checks(
    settings: Any,
) -> None:
    """Not a django-redis cache: said at first use; this check adds nothing, and does
    not fail the check run."""
    local = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    settings.CACHES = {**settings.CACHES, "local": local}
    settings.DELAYJOBS = {**settings.DELAYJOBS, "CACHE_ALIAS": "local"}
    assert w005() == []
