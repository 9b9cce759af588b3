"""Errors raised by the engine. No Django here: the Django layer re-exports them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import redis
from redis.exceptions import RedisClusterException

T = TypeVar("T")


class DelayJobsError(Exception):
    """Base class of every error django-delayjobs raises on purpose."""


class EngineUnavailable(DelayJobsError):
    """Redis could not be reached or answered with an error; nothing was changed."""


def guarded(fn: Callable[[], T]) -> T:
    """Call ``fn``; a Redis error becomes ``EngineUnavailable``, saying which kind it was
    (a server that is out of memory refuses, it is not unreachable)."""
    try:
        return fn()
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise EngineUnavailable(f"Redis is unreachable: {exc}") from exc
    except redis.ResponseError as exc:
        raise EngineUnavailable(f"Redis refused the command: {exc}") from exc
    except (redis.RedisError, RedisClusterException) as exc:  # ClusterDown, no slots...
        raise EngineUnavailable(f"the Redis Cluster cannot serve: {exc}") from exc
