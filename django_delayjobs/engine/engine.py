"""The engine: typed Python methods over one Lua script per move. Pure redis-py."""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any, TypeVar, cast

import redis
from redis.commands.core import Script

from .errors import EngineUnavailable
from .keys import QueueKeys, validate_name

T = TypeVar("T")
Rows = list[tuple[bytes, float]]  # a WITHSCORES reply

#: Largest number of ids one script call may move. Lua's ``unpack`` stops near 8,000
#: values, and a bounded call keeps Redis responsive however large the backlog is.
MAX_BATCH = 5000

_SCRIPTS = (
    "add",
    "remove",
    "reschedule",
    "promote",
    "claim",
    "extend_lease",
    "ack",
    "nack",
    "bury",
    "requeue",
    "purge",
    "recover_expired",
    "stats",
    "heartbeat",
)


@cache
def script_source(name: str) -> str:
    """Return the Lua source of one script shipped in ``engine/scripts``."""
    return resources.files(__package__).joinpath("scripts", f"{name}.lua").read_text()


@dataclass(frozen=True)
class PromoteResult:
    moved: int
    now_ms: int
    next_due_ms: int | None  # None when nothing is pending
    next_due_in_us: int | None = None  # from the exact server time (now_ms is whole ms)


@dataclass(frozen=True)
class QueueStats:
    queue: str
    now_ms: int
    pending: int  # waiting in the pending ZSET, overdue ones included
    overdue: int  # due but not yet promoted
    ready: int
    in_flight: int
    expired_leases: int
    garbage: int
    live_workers: int
    next_due_ms: int | None
    oldest_lease_ms: int | None
    counters: dict[str, int] = field(default_factory=dict)


def _ids(ids: Iterable[object]) -> list[str]:
    """Return the ids, each once, in the order given (a repeat would be counted twice)."""
    if isinstance(ids, str | bytes):
        raise TypeError("ids must be a collection of str, not a single string")
    given = list(ids)
    if not given:
        raise ValueError("the batch of ids is empty")
    if len(given) > MAX_BATCH:
        raise ValueError(f"at most {MAX_BATCH} ids per call, got {len(given)}")
    checked: dict[str, None] = {}
    for id_ in given:
        if not isinstance(id_, str):
            raise TypeError(f"job ids must be str, not {type(id_).__name__}")
        if not id_ or len(id_) > 128 or not id_.isprintable() or " " in id_:
            raise ValueError(f"job id {id_!r} must be 1 to 128 printable, non-space characters")
        checked[id_] = None
    return list(checked)


def _ms(value: object, what: str = "time") -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number of milliseconds, not {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a finite, non-negative number of ms, got {value!r}")
    return int(value)


def _batch(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"batch must be an int, not {type(value).__name__}")
    if not 1 <= value <= MAX_BATCH:
        raise ValueError(f"batch must be between 1 and {MAX_BATCH}, got {value}")
    return value


def _pairs(items: Mapping[str, float]) -> list[str | int]:
    if not isinstance(items, Mapping):
        raise TypeError("expected a mapping of job id -> due time (ms)")
    flat: list[str | int] = []
    for id_, due in zip(_ids(items.keys()), items.values(), strict=True):
        flat += [id_, _ms(due, "due time")]
    return flat


def _seconds(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"timeout must be a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"timeout must be a finite, non-negative number of s, got {value!r}")
    return float(value)


def _longest_block(client: redis.Redis) -> float | None:
    """Return how long a blocking command may wait on ``client`` (None: no limit).

    A reply that takes longer than the socket timeout raises ``TimeoutError``, so a wait
    stops half a second short of it (at a quarter of a timeout under 2/3 s): Redis may
    answer a blocking command up to one ``hz`` tick (100 ms by default) after its timeout.
    """
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    if "socket_timeout" in kwargs:
        timeout = kwargs["socket_timeout"]
    else:
        # from_url() without socket_timeout leaves it out of the kwargs: the connection
        # class's own default applies (5 s from redis-py 8 on, none before).
        timeout = _default_socket_timeout(getattr(pool, "connection_class", None))
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        return None
    return timeout - min(0.5, 0.75 * timeout)


def _default_socket_timeout(connection_class: object) -> object:
    for klass in getattr(connection_class, "__mro__", ()):
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            parameter = inspect.signature(init).parameters.get("socket_timeout")
        except (TypeError, ValueError):
            return None
        if parameter is not None:
            return parameter.default
    return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _opt_int(value: Any) -> int | None:
    return None if value is None or int(float(value)) < 0 else int(float(value))


class Engine:
    """The delay queue of one Redis database.

    Ids and times only: the payload of a job lives elsewhere (the Django layer keeps it
    in the database). Times are milliseconds since the epoch; every due-time comparison
    happens inside Redis against its ``TIME``.
    """

    def __init__(self, client: redis.Redis, prefix: str = "delayjobs") -> None:
        self.client = client
        self.prefix = validate_name(prefix, "prefix")
        self._scripts: dict[str, Script] = {
            name: client.register_script(script_source(name)) for name in _SCRIPTS
        }
        self._longest_block = _longest_block(client)

    def keys(self, queue: str) -> QueueKeys:
        return QueueKeys.for_queue(self.prefix, validate_name(queue, "queue name"))

    @property
    def queues_key(self) -> str:
        # Outside every queue's hash tag on purpose: a directory, written beside the
        # scripts (not inside them) so each script still touches a single slot.
        return f"{{{self.prefix}}}:queues"

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise EngineUnavailable(f"Redis is unreachable: {exc}") from exc
        except redis.ResponseError as exc:
            raise EngineUnavailable(f"Redis refused the command: {exc}") from exc

    def _run(self, name: str, keys: Sequence[str], args: Sequence[str | int]) -> Any:
        return self._call(lambda: self._scripts[name](keys=keys, args=args))

    # -- scheduling --------------------------------------------------------------

    def add(self, queue: str, items: Mapping[str, float]) -> list[str]:
        """Add ids with due times (ms); return the ids Redis did not hold before."""
        k = self.keys(queue)
        keys = [k.pending, k.ready, k.ready_set, k.unack, k.garbage, k.wake, k.notify, k.counters]
        was_empty, added = self._run("add", keys, _pairs(items))
        if was_empty:
            # The directory lies outside the queue's hash tag, so the script cannot write
            # it; a queue is listed from the first add that finds it empty (after a flush
            # too), which keeps the common add at one round trip.
            self._call(lambda: self.client.sadd(self.queues_key, queue))
        return [_text(id_) for id_ in added]

    def remove(self, queue: str, ids: Iterable[str]) -> int:
        """Remove ids not yet claimed (pending or ready); return how many were removed."""
        k = self.keys(queue)
        return int(self._run("remove", [k.pending, k.ready_set, k.counters], _ids(ids)))

    def reschedule(self, queue: str, id: str, due_ms: float) -> bool:
        """Move a still-pending id to a new due time; False if it already left pending."""
        k = self.keys(queue)
        args: list[str | int] = [*_ids([id]), _ms(due_ms, "due time")]
        keys = [k.pending, k.ready, k.ready_set, k.wake, k.notify]
        return bool(self._run("reschedule", keys, args))

    # -- the promoter --------------------------------------------------------------

    def promote(self, queue: str, batch: int = 1000) -> PromoteResult:
        """Move up to ``batch`` due ids into ready; report when the next one is due."""
        k = self.keys(queue)
        keys = [k.pending, k.ready, k.ready_set, k.notify]
        moved, now, *rest = self._run("promote", keys, [_batch(batch)])
        if not rest:
            return PromoteResult(int(moved), int(now), None)
        return PromoteResult(int(moved), int(now), int(float(rest[0])), int(rest[1]))

    def recover_expired(self, queue: str, batch: int = 1000) -> list[str]:
        """Put ids whose lease ran out back at the head of ready; return them."""
        k = self.keys(queue)
        keys = [k.unack, k.ready, k.ready_set, k.notify, k.counters]
        return [_text(i) for i in self._run("recover_expired", keys, [_batch(batch)])]

    def wait_for_wake(self, queues: Sequence[str], timeout: float) -> bool:
        """Block until a job due earlier than the known earliest is added, or ``timeout``.

        Redis checks blocking timeouts about every 100 ms (``hz 10``), so a caller that
        needs a precise wake-up time sleeps the last stretch itself. The wait never
        outlasts the client's socket timeout (see ``_blpop``): False may come early.
        """
        return self._blpop(queues, "wake", timeout)

    # -- the worker ----------------------------------------------------------------

    def claim(self, queue: str, count: int = 1, lease_ms: float = 300_000) -> list[str]:
        """Move up to ``count`` ids from ready into flight with a lease; return them.

        Entries left in ready by ``remove`` are skipped. One call skips at most 1000 of
        them, so it may return fewer ids than ready holds; it then leaves a work token,
        and ``wait_for_work`` returns at once.
        """
        k = self.keys(queue)
        args = [_batch(count), _ms(lease_ms, "lease")]
        keys = [k.ready, k.ready_set, k.unack, k.notify]
        return [_text(i) for i in self._run("claim", keys, args)]

    def wait_for_work(self, queues: Sequence[str], timeout: float) -> bool:
        """Block until ids enter ready on one of ``queues``, or ``timeout`` seconds pass.

        The wait never outlasts the client's socket timeout (see ``_blpop``): False may
        come early.
        """
        return self._blpop(queues, "notify", timeout)

    def extend_lease(self, queue: str, ids: Iterable[str], lease_ms: float) -> list[str]:
        """Renew the lease of ids still in flight; return those (the rest were lost)."""
        k = self.keys(queue)
        args: list[str | int] = [_ms(lease_ms, "lease"), *_ids(ids)]
        return [_text(i) for i in self._run("extend_lease", [k.unack], args)]

    def ack(self, queue: str, ids: Iterable[str]) -> int:
        """Forget finished in-flight ids; return how many were in flight."""
        k = self.keys(queue)
        return int(self._run("ack", [k.unack, k.counters], _ids(ids)))

    def nack(self, queue: str, items: Mapping[str, float]) -> int:
        """Hand in-flight ids back to pending with retry times; return how many moved."""
        k = self.keys(queue)
        keys = [k.unack, k.pending, k.wake, k.counters]
        return int(self._run("nack", keys, _pairs(items)))

    def bury(self, queue: str, ids: Iterable[str]) -> int:
        """Move in-flight ids to garbage; return how many moved."""
        k = self.keys(queue)
        return int(self._run("bury", [k.unack, k.garbage, k.counters], _ids(ids)))

    # -- garbage -------------------------------------------------------------------

    def requeue(self, queue: str, ids: Iterable[str], due_ms: float = 0) -> int:
        """Move buried ids back to ready (or pending, if ``due_ms`` is later than now)."""
        k = self.keys(queue)
        keys = [k.garbage, k.pending, k.ready, k.ready_set, k.wake, k.notify]
        return int(self._run("requeue", keys, [_ms(due_ms, "due time"), *_ids(ids)]))

    def purge(self, queue: str, ids: Iterable[str]) -> int:
        """Delete buried ids; return how many were in garbage."""
        return int(self._run("purge", [self.keys(queue).garbage], _ids(ids)))

    def garbage(self, queue: str, limit: int = 100) -> list[tuple[str, int]]:
        """Return the most recently buried ids with their time of death (ms)."""
        key = self.keys(queue).garbage
        last = _batch(limit) - 1
        rows = cast(Rows, self._call(lambda: self.client.zrevrange(key, 0, last, True)))
        return [(_text(id_), int(score)) for id_, score in rows]

    # -- observing -----------------------------------------------------------------

    def stats(self, queue: str) -> QueueStats:
        """Return counts and times of one queue, read atomically."""
        k = self.keys(queue)
        keys = [k.pending, k.ready_set, k.unack, k.garbage, k.workers, k.counters]
        now, pend, overdue, ready, flight, expired, garb, live, nxt, lease, flat = self._run(
            "stats", keys, []
        )
        counters = {_text(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}
        return QueueStats(
            queue, int(now), int(pend), int(overdue), int(ready), int(flight), int(expired),
            int(garb), int(live), _opt_int(nxt), _opt_int(lease), counters,
        )  # fmt: skip

    def next_due(self, queue: str, limit: int = 10) -> list[tuple[str, int]]:
        """Return the ``limit`` pending ids due soonest, with their due times (ms)."""
        key = self.keys(queue).pending
        last = _batch(limit) - 1
        rows = cast(Rows, self._call(lambda: self.client.zrange(key, 0, last, withscores=True)))
        return [(_text(id_), int(score)) for id_, score in rows]

    def known_queues(self) -> list[str]:
        """Return every queue that was ever added to, sorted."""
        return sorted(_text(q) for q in self._call(lambda: self.client.smembers(self.queues_key)))

    def heartbeat(
        self, queue: str, worker_id: str, ttl_ms: float, info: Mapping[str, Any] | None = None
    ) -> int:
        """Record a live worker for ``ttl_ms`` (0 removes it); return live workers."""
        k = self.keys(queue)
        args: list[str | int] = [*_ids([worker_id]), _ms(ttl_ms, "ttl")]
        args.append(json.dumps(dict(info or {})))
        return int(self._run("heartbeat", [k.workers, k.worker_info], args))

    def workers(self, queue: str) -> list[dict[str, Any]]:
        """Return the live workers of a queue: their description and heartbeat expiry."""
        k = self.keys(queue)

        def run() -> tuple[Rows, dict[bytes, bytes]]:
            now_ms = self.server_time_ms()
            alive = self.client.zrangebyscore(k.workers, now_ms + 1, "+inf", withscores=True)
            return cast(Rows, alive), cast(dict[bytes, bytes], self.client.hgetall(k.worker_info))

        alive, info = self._call(run)
        return [
            {"id": _text(w), "expires_ms": int(s), **json.loads(info.get(w, b"{}"))}
            for w, s in alive
        ]

    @property
    def owner_key(self) -> str:
        # Beside the queue directory, outside every queue's hash tag.
        return f"{{{self.prefix}}}:deployment"

    def claim_owner(self, owner: str) -> str:
        """Record ``owner`` as the one deployment using this prefix, unless one is recorded
        already; return the recorded one (``owner`` if this call recorded it)."""

        def run() -> Any:
            self.client.set(self.owner_key, owner, nx=True)
            return self.client.get(self.owner_key)

        recorded = self._call(run)
        return owner if recorded is None else _text(recorded)

    def info(self) -> dict[str, Any]:
        """Return Redis's ``INFO`` (version, memory policy, ...)."""
        return self._call(self.client.info)

    def server_time_ms(self) -> int:
        """Return Redis's clock in ms: the clock every due time is compared with."""
        seconds, micros = self._call(self.client.time)
        return int(seconds) * 1000 + int(micros) // 1000

    # -- helpers -------------------------------------------------------------------

    def _blpop(self, queues: Sequence[str], key: str, timeout: float) -> bool:
        """Pop one token from the ``key`` list of the first of ``queues`` that has one.

        Waits at most ``timeout`` seconds, and never as long as the client's socket
        timeout (less half a second): a longer BLPOP would fail with a read timeout.
        So this may return False before ``timeout``; callers wait in a loop anyway.
        """
        if isinstance(queues, str | bytes) or not isinstance(queues, Iterable):
            raise TypeError(f"queues must be a list of queue names, not {type(queues).__name__}")
        keys = [getattr(self.keys(q), key) for q in queues]
        if not keys:
            raise ValueError("no queues to wait on")
        seconds = _seconds(timeout)
        if self._longest_block is not None:
            seconds = min(seconds, self._longest_block)
        popped = self._call(lambda: self.client.blpop(keys, timeout=max(seconds, 0.001)))
        return popped is not None
