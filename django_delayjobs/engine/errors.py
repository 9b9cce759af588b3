"""Errors raised by the engine. No Django here: the Django layer re-exports them."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import redis
from redis.exceptions import ClusterError, RedisClusterException

T = TypeVar("T")


class DelayJobsError(Exception):
    """Base class of every error django-delayjobs raises on purpose."""


class EngineUnavailable(DelayJobsError):
    """Redis could not be reached or answered with an error; nothing was changed."""


class WrongType(EngineUnavailable):
    """A key of a queue (or shard) holds another Redis type than the layout gives it:
    another program wrote it. That queue cannot be served until the key is deleted or
    renamed; every other queue can (Redis itself is fine). The message names the key."""


class PartlyUnavailable(EngineUnavailable):
    """Some shards could not be reached (a master of a Cluster is down); the call went on
    with the others and changed them. ``done`` is what it did there: what it returns when
    every shard answers (the ids added, a count...)."""

    def __init__(self, message: str, done: Any) -> None:
        super().__init__(message)
        self.done = done


class PerShard:
    """Go on past the shards (or queues) whose master cannot be reached, then report the
    first failure: one dead master must not stop the work on the healthy ones::

        each = PerShard()
        for shard in shards:
            with each.attempt():
                ...
        each.check(done)  # PartlyUnavailable(done) if a shard failed, or the failure
                          # itself if none answered

    With ``one_server`` (every shard on one Redis), ``run`` calls nothing more and
    ``until_down`` yields nothing more once Redis was not reached or did not answer
    (``down``): each call would wait for the same timeout. On a Cluster they go on past a
    dead master.
    """

    def __init__(self, *, one_server: bool = False) -> None:
        self.failure: EngineUnavailable | None = None
        self.reached = False  # a call succeeded, at least in part
        self.one_server = one_server

    @contextlib.contextmanager
    def attempt(self) -> Iterator[None]:
        try:
            yield
        except EngineUnavailable as exc:
            self.failure = self.failure or exc
            self.reached = self.reached or isinstance(exc, PartlyUnavailable)
        else:
            self.reached = True

    def skip(self, exc: EngineUnavailable) -> None:
        """Note a failure of a step that changed nothing (reading where to look next)."""
        self.failure = self.failure or exc

    @property
    def down(self) -> bool:
        """With ``one_server``: Redis was not reached or did not answer, so every further
        call would wait for the same timeout."""
        return self.one_server and self.failure is not None and unreachable(self.failure)

    def until_down(self, names: Iterable[T]) -> Iterator[T]:
        """``names`` (shards, queues) one by one, until ``down``."""
        for name in names:
            if self.down:
                return
            yield name

    def run(self, fn: Callable[[], T], default: T) -> T:
        """``fn()``; if it fails, what it did (``PartlyUnavailable.done``) or ``default``."""
        result = default
        if self.down:
            return result
        with self.attempt():
            try:
                result = fn()
            except PartlyUnavailable as exc:
                result = exc.done
                raise
        return result

    def check(self, done: Any = None) -> None:
        if self.failure is None:
            return
        if not self.reached:
            raise self.failure
        raise PartlyUnavailable(str(self.failure), done) from self.failure


def unreachable(exc: BaseException) -> bool:
    """Whether an ``EngineUnavailable`` is Redis not reached or not answering, rather than
    a refusal (out of memory, a wrong type): every other call to it would fail alike."""
    return isinstance(exc.__cause__, redis.ConnectionError | redis.TimeoutError)


def first_failure(exc: EngineUnavailable) -> EngineUnavailable:
    """The failure a ``PartlyUnavailable`` reports (``PerShard.check`` raises it from its
    first failure, itself maybe a ``PartlyUnavailable`` of an inner step); ``exc`` if not
    one: whether the sweep met Redis unreachable or a refusal (``unreachable``)."""
    while isinstance(exc, PartlyUnavailable) and isinstance(exc.__cause__, EngineUnavailable):
        exc = exc.__cause__
    return exc


def replica_refused(exc: BaseException) -> bool:
    """Whether an ``EngineUnavailable`` is a write refused by a replica (READONLY; from
    inside a script, Redis 6 gives it as the script's error)."""
    cause = exc.__cause__
    if isinstance(cause, redis.ReadOnlyError):
        return True
    return isinstance(cause, redis.ResponseError) and "-READONLY " in str(cause)


def guarded(fn: Callable[[], T]) -> T:
    """Call ``fn``; a Redis error becomes ``EngineUnavailable``, saying which kind it was
    (a server that is out of memory refuses, it is not unreachable)."""
    try:
        return fn()
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise EngineUnavailable(f"Redis is unreachable: {exc}") from exc
    except redis.ResponseError as exc:
        if str(exc).startswith("WRONGTYPE"):
            raise WrongType(f"a key has the wrong type: {exc}") from exc
        raise EngineUnavailable(f"Redis refused the command: {exc}") from exc
    except ClusterError as exc:  # redis-py's "TTL exhausted.": it gave up following
        raise EngineUnavailable(gave_up(exc)) from exc
    except (redis.RedisError, RedisClusterException) as exc:  # ClusterDown, no slots...
        raise EngineUnavailable(f"the Redis Cluster cannot serve: {exc}") from exc


def gave_up(exc: ClusterError) -> str:
    """What redis-py's bare "TTL exhausted." means: the command was redirected (MOVED, ASK),
    told to try again (TRYAGAIN) or failed to connect over and over, and it stopped."""
    connection = getattr(exc, "connection", None)  # the last one redis-py used, if any
    host, port = getattr(connection, "host", None), getattr(connection, "port", None)
    node = f"{host}:{port}" if host else ""
    return (
        "the Redis Cluster could not serve the command: redis-py gave up after being "
        "redirected or failing to connect again and again (slots moving between masters, "
        "a failover in progress, or nodes unreachable)"
        + (f"; the last node tried was {node}" if node else "")
        + f" ({exc})"
    )
