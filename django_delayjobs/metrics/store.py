"""The metrics' Redis layout (see ``layout``): writes from the recorder, reads for the
Prometheus exposition and the admin charts. Pure redis-py, through the engine's client.

Each flush writes one queue in one MULTI/EXEC (its keys share the queue's hash tag, so
this also works per slot on Redis Cluster). A minute's hash expires ``ttl`` seconds
after its last write; the running totals never expire (Prometheus counters handle the
reset that a Redis which lost its data brings).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from ..engine.errors import PerShard, guarded
from . import layout

if TYPE_CHECKING:
    from ..engine import Engine

Fields = dict[str, float]


def totals_key(engine: Engine, queue: str) -> str:
    engine.keys(queue)  # validates the name
    return f"{{{engine.prefix}:{queue}}}:{layout.TOTALS_SUFFIX}"


def minute_key(engine: Engine, queue: str, minute: int) -> str:
    return f"{totals_key(engine, queue)}:{minute}"


def _fields(raw: Mapping[bytes, bytes]) -> Fields:
    return {k.decode(): float(v) for k, v in raw.items()}


def write(
    engine: Engine,
    tallies: Mapping[tuple[str, int | None], Mapping[str, float]],
    snapshot: Sequence[str],
    minute: int,
    ttl: int,
    written: set[str],
) -> None:
    """Add the tallies; give ``minute`` of each queue in ``snapshot`` its snapshot of the
    engine counters unless one is there already. Each queue goes into ``written`` once its
    MULTI/EXEC is applied. A queue whose master (or one of whose shards' masters) cannot be
    reached does not stop the others: they are written, then the failure is raised."""
    by_queue: dict[str, list[tuple[int | None, Mapping[str, float]]]] = defaultdict(list)
    for (queue, at), tally in tallies.items():
        by_queue[queue].append((at, tally))
    each = PerShard()
    for queue in sorted(set(by_queue) | set(snapshot)):
        with each.attempt():
            counters = _counters(engine, queue) if queue in snapshot else None
            _write_queue(engine, queue, by_queue.get(queue, []), counters, minute, ttl)
            written.add(queue)
    each.check()


def _counters(engine: Engine, queue: str) -> list[int]:
    """The engine's ``added``/``removed`` counters of a queue (summed over its shards), in
    one round trip."""
    names = list(layout.SNAPSHOT_FIELDS)
    shards = engine.shards(queue)

    def run() -> list[Any]:
        pipe = engine.client.pipeline(transaction=False)
        for shard in shards:
            pipe.hmget(engine.keys(shard).counters, names)
        return cast(list[Any], pipe.execute())

    per_shard = guarded(run)
    return [sum(int(v or 0) for v in column) for column in zip(*per_shard, strict=True)]


def _write_queue(
    engine: Engine,
    queue: str,
    tallies: Iterable[tuple[int | None, Mapping[str, float]]],
    counters: list[Any] | None,
    minute: int,
    ttl: int,
) -> None:
    pipe = engine.client.pipeline(transaction=True)
    for at, tally in tallies:
        key = totals_key(engine, queue) if at is None else minute_key(engine, queue, at)
        for name, amount in tally.items():
            if name.endswith(":sum"):
                pipe.hincrbyfloat(key, name, amount)
            else:
                pipe.hincrby(key, name, int(amount))
        if at is not None:
            pipe.expire(key, ttl)
    if counters is not None:
        key = minute_key(engine, queue, minute)
        for field, value in zip(layout.SNAPSHOT_FIELDS.values(), counters, strict=True):
            pipe.hsetnx(key, field, int(value or 0))
        pipe.expire(key, ttl)
    guarded(pipe.execute)


def totals(engine: Engine, queues: Sequence[str]) -> dict[str, Fields]:
    """The running totals of each queue, in one round trip."""

    def run() -> list[Any]:
        pipe = engine.client.pipeline(transaction=False)
        for queue in queues:
            pipe.hgetall(totals_key(engine, queue))
        return cast(list[Any], pipe.execute())

    return {q: _fields(raw) for q, raw in zip(queues, guarded(run), strict=True)}


def minutes(engine: Engine, queue: str, first: int, last: int) -> dict[int, Fields]:
    """The per-minute hashes of one queue from ``first`` to ``last`` (inclusive) that
    exist, by minute, in one round trip."""

    def run() -> list[Any]:
        pipe = engine.client.pipeline(transaction=False)
        for at in range(first, last + 1):
            pipe.hgetall(minute_key(engine, queue, at))
        return cast(list[Any], pipe.execute())

    found = guarded(run)
    return {first + i: _fields(raw) for i, raw in enumerate(found) if raw}
