"""The metrics' Redis layout (see ``layout``): writes from the recorder, reads for the
Prometheus exposition and the admin charts. Pure redis-py, through the engine's client.

Each flush writes one queue in one MULTI/EXEC, and once a minute its snapshot of the
engine counters in another (its keys share the queue's hash tag, so this also works per
slot on Redis Cluster). A minute's hash expires ``ttl`` seconds after its last write; the
running totals never expire (Prometheus counters handle the reset that a Redis which
lost its data brings).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from ..engine.errors import EngineUnavailable, PerShard, WrongType, guarded
from ..engine.errors import unreachable as not_answering
from ..engine.reader import counter_value
from . import layout

if TYPE_CHECKING:
    from ..engine import Engine

Fields = dict[str, float]


def totals_key(engine: Engine, queue: str) -> str:
    engine.keys(queue)  # validates the name
    return f"{{{engine.prefix}:{queue}}}:{layout.TOTALS_SUFFIX}"


def minute_key(engine: Engine, queue: str, minute: int) -> str:
    return f"{totals_key(engine, queue)}:{minute}"


def _fields(raw: Mapping[bytes | str, bytes | str]) -> Fields:
    """A metrics hash's fields (bytes, or str from a client that decodes its replies, as
    the engine takes). The recorder writes only finite numbers under UTF-8 names, but
    another program may write anything: such a field is left out, as the engine's reader
    leaves out a counter that is not an integer, so that one odd field does not make every
    scrape and chart fail."""
    found: Fields = {}
    for name, value in raw.items():
        try:
            number = float(value)
            if math.isfinite(number):
                found[name.decode() if isinstance(name, bytes) else name] = number
        except ValueError:  # UnicodeDecodeError included
            continue
    return found


#: Increments by (queue, minute or None for the totals), then field.
Increments = dict[tuple[str, int | None], dict[str, float]]


def write(
    engine: Engine,
    tallies: Mapping[tuple[str, int | None], Mapping[str, float]],
    snapshot: Sequence[str],
    minute: int,
    ttl: int,
    written: set[str],
    refused: Increments | None = None,
    snapped: set[str] | None = None,
) -> None:
    """Add the tallies; give ``minute`` of each queue in ``snapshot`` its snapshot of the
    engine counters unless one is there already. Each queue goes into ``written`` once the
    MULTI/EXEC of its tallies has run, and into ``snapped`` once its snapshot's has: the
    tallies go first, so counters that cannot be read (a shard's master down, a key of
    another program's type) hold back only the snapshot, and a master that does not
    answer is waited for once. Redis runs every command of an EXEC but those it refuses (a
    key of the wrong type, another program's): their increments go into ``refused``, the
    rest are written, then the refusal is raised. A queue whose master (or one of whose
    shards' masters) cannot be reached does not stop the others: they are written, then
    the failure is raised (on one Redis that does not answer, the others are not tried)."""
    by_queue: dict[str, list[tuple[int | None, Mapping[str, float]]]] = defaultdict(list)
    for (queue, at), tally in tallies.items():
        by_queue[queue].append((at, tally))
    # On one Redis, the first queue it does not answer ends the flush: each other queue's
    # would wait for the same timeout (and a stop waits for this one's end).
    each = PerShard(one_server=not engine.is_cluster)
    for queue in each.until_down(sorted(set(by_queue) | set(snapshot))):
        with each.attempt():
            refusals = {} if refused is None else refused
            partly: EngineUnavailable | None = None  # Redis ran the EXEC, refused some
            if queue in by_queue:
                try:
                    _write_queue(engine, queue, by_queue[queue], None, minute, ttl, written,
                                 refusals)  # fmt: skip
                except EngineUnavailable as exc:
                    if queue not in written:
                        raise  # not run: the snapshot would wait for the same master
                    partly = exc
            if queue in snapshot:
                counters = _counters(engine, queue)
                _write_queue(engine, queue, [], counters, minute, ttl,
                             set() if snapped is None else snapped, refusals)  # fmt: skip
            if partly is not None:
                raise partly
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
    # 0 for a counter that is not an integer (another program's), as ``stats`` leaves it
    # out: a ValueError here would end the flush, and with it the housekeeping thread.
    return [sum(counter_value(v) or 0 for v in column) for column in zip(*per_shard, strict=True)]


def _write_queue(
    engine: Engine,
    queue: str,
    tallies: Iterable[tuple[int | None, Mapping[str, float]]],
    counters: list[Any] | None,
    minute: int,
    ttl: int,
    written: set[str],
    refused: Increments,
) -> None:
    pipe = engine.client.pipeline(transaction=True)
    carried: list[tuple[int | None, str, float] | None] = []  # each command's increment
    for at, tally in tallies:
        key = totals_key(engine, queue) if at is None else minute_key(engine, queue, at)
        for name, amount in tally.items():
            if name.endswith(":sum"):
                pipe.hincrbyfloat(key, name, amount)
            else:
                pipe.hincrby(key, name, int(amount))
            carried.append((at, name, amount))
        if at is not None:
            pipe.expire(key, ttl)
            carried.append(None)
    if counters is not None:
        key = minute_key(engine, queue, minute)
        for field, value in zip(layout.SNAPSHOT_FIELDS.values(), counters, strict=True):
            pipe.hsetnx(key, field, int(value or 0))
        pipe.expire(key, ttl)
        carried += [None] * (len(counters) + 1)
    replies = guarded(lambda: pipe.execute(raise_on_error=False))
    written.add(queue)  # it ran: what Redis applied must never be written again
    errors = [r for r in replies if isinstance(r, Exception)]
    for increment, reply in zip(carried, replies, strict=True):
        if increment is not None and isinstance(reply, Exception):
            at, name, amount = increment
            refused.setdefault((queue, at), defaultdict(float))[name] += amount
    if errors:
        _raise(errors[0])


def _raise(error: Exception) -> None:
    """Raise a command's error from a pipeline's replies as the engine does:
    ``WrongType`` or ``EngineUnavailable``."""

    def refuse() -> None:
        raise error

    guarded(refuse)


def totals(
    engine: Engine,
    queues: Sequence[str],
    unreachable: dict[str, str] | None = None,
    down: dict[str, str] | None = None,
) -> dict[str, Fields]:
    """The running totals of each queue, in one round trip (two per master on a Cluster);
    a queue whose totals key has another type (another program's key) is left out, not
    every queue. On a Cluster with a master down, so is each queue on that master (with
    why in ``unreachable``) as long as another master answers; that master goes into
    ``down`` (see ``Engine.stats``)."""
    keys = [totals_key(engine, queue) for queue in queues]
    if engine.is_cluster and len(keys) > 1:
        found = _by_master(engine, queues, keys, unreachable, down)
    else:
        found = _hashes(engine, keys)
    return {queue: fields for queue, fields in zip(queues, found, strict=True)
            if fields is not None}  # fmt: skip


def _by_master(
    engine: Engine,
    queues: Sequence[str],
    keys: list[str],
    unreachable: dict[str, str] | None,
    down: dict[str, str] | None,
) -> list[Fields | None]:
    """``_hashes`` of a Cluster's keys (``keys[n]`` of ``queues[n]``, in its hash tag),
    master by master: its first key alone, then the rest in one round trip. redis-py sends
    each command of a pipeline that met a timeout again, one at a time, each waiting for
    its own: a frozen master cost every queue on it a timeout and a retry (six queues
    there held a scrape for 27 s, past Prometheus's 10 s, so every queue's series were
    lost). Now it costs the one key's (about 3 s), and nothing if ``down`` lists it."""
    by_master: dict[str, list[int]] = {}
    masters: dict[str, str] = {}  # a queue's keys share its hash tag (its minutes too)
    for n, queue in enumerate(queues):
        if queue not in masters:
            try:
                masters[queue] = engine.node_of(queue)  # the client's slot table: no round trip
            except EngineUnavailable:  # a slot with no master: tried alone, and fails
                masters[queue] = f"no master for {queue}"
        by_master.setdefault(masters[queue], []).append(n)
    found: list[Fields | None] = [None] * len(keys)
    each = PerShard()
    for master, group in by_master.items():
        read: set[int] = set()
        with each.attempt():
            try:
                if down is not None and master in down:  # another read of the caller's
                    raise EngineUnavailable(f"{down[master]} (master {master}, not asked again)")
                for part in (group[:1], group[1:]):
                    replies = _hashes(engine, [keys[n] for n in part]) if part else []
                    for n, fields in zip(part, replies, strict=True):
                        found[n] = fields
                    read.update(part)
            except EngineUnavailable as exc:
                if unreachable is not None:
                    unreachable.update((queues[n], str(exc)) for n in group if n not in read)
                if down is not None and not_answering(exc):
                    down.setdefault(master, str(exc))
                raise
    if not each.reached:
        each.check()  # none answered: raises
    return found


def minutes(engine: Engine, queue: str, first: int, last: int) -> dict[int, Fields]:
    """The per-minute hashes of one queue from ``first`` to ``last`` (inclusive) that
    exist, by minute, in one round trip; a minute whose key has another type (another
    program's) is left out, not the queue's every minute and every other queue."""
    return minutes_of(engine, [queue], first, last)[queue]


def minutes_of(
    engine: Engine,
    queues: Sequence[str],
    first: int,
    last: int,
    unreachable: dict[str, str] | None = None,
    down: dict[str, str] | None = None,
) -> dict[str, dict[int, Fields]]:
    """``minutes`` of each of ``queues``, all in one round trip (two per master on a
    Cluster). On a Cluster with a master down, each queue on it is left out (with why in
    ``unreachable``) as long as another master answers, as ``totals`` says."""
    span = range(first, last + 1)
    keys = [minute_key(engine, q, at) for q in queues for at in span]
    failed: dict[str, str] = {}
    if engine.is_cluster and (len(queues) > 1 or down):  # a master down is not asked again
        found = _by_master(engine, [q for q in queues for _ in span], keys, failed, down)
    else:
        found = _hashes(engine, keys)
    if unreachable is not None:
        unreachable.update(failed)
    return {
        queue: {first + i: f for i, f in enumerate(found[n * len(span) : (n + 1) * len(span)]) if f}
        for n, queue in enumerate(queues)
        if queue not in failed
    }


def _hashes(engine: Engine, keys: Sequence[str]) -> list[Fields | None]:
    """The fields of each hash, in one round trip; None for a key of another type."""

    def run() -> list[Any]:
        pipe = engine.client.pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(key)
        return cast(list[Any], pipe.execute(raise_on_error=False))

    found: list[Fields | None] = []
    for raw in guarded(run):
        if isinstance(raw, Exception):
            try:
                _raise(raw)
            except WrongType:
                found.append(None)
                continue
        found.append(_fields(raw))
    return found
