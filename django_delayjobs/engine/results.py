"""What the engine reports: promote results and queue statistics (summed over shards)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .errors import EngineUnavailable


class Added(list[str]):
    """The ids an ``add`` put in Redis that it held nowhere before. ``moved``: the ids it
    took out of a shard of an older count of the queue (they waited there) and added to
    their shard under the current count; held before, so not in the list itself."""

    def __init__(self, ids: Iterable[str] = (), moved: Iterable[str] = ()) -> None:
        super().__init__(ids)
        self.moved = list(moved)


class Leased(list[str]):
    """The ids a claim or a lease extension put in flight, in order. ``leases``: each id's
    lease, its unack score exactly as Redis gave it back. An extension given it extends
    the id only while that lease is still the one in Redis (see ``Engine.extend_lease``).
    ``shards``: a claim's, the shard each id came from, by a name that addresses that
    shard alone (a queue's name may stand for several, after its count changed).
    ``replayed``: a claim's ids returned by a call sent again (see claims.py), whose lease
    was set when Redis first ran it, not by this sending. ``dropped``: members a claim took
    that are no ids the engine takes (another program's), taken out of flight, not
    returned. ``failure``: a claim's, the error that ended it once it had taken ids or
    dropped members (a shard that failed after others answered, or a drop that failed),
    which are returned all the same."""

    def __init__(
        self,
        leases: Mapping[str, str] | None = None,
        shards: Mapping[str, str] | None = None,
        replayed: Iterable[str] = (),
        dropped: Iterable[str] = (),
        failure: EngineUnavailable | None = None,
    ) -> None:
        super().__init__(leases or {})
        self.leases = dict(leases or {})
        self.shards = dict(shards or {})
        self.replayed = frozenset(replayed)
        self.dropped = list(dropped)
        self.failure = failure


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
    #: None when it could not be read: a queue split into shards records its workers in
    #: the keys of its own name, whose Cluster master may be down while its shards' answer.
    live_workers: int | None
    next_due_ms: int | None
    oldest_lease_ms: int | None
    counters: dict[str, int] = field(default_factory=dict)
    #: Per shard, when the queue has more than one (each with its shard name as queue).
    shards: tuple[QueueStats, ...] = ()


class Overview(NamedTuple):
    """One queue as ``Reader.overview`` reads it."""

    stats: QueueStats
    next_due: list[tuple[str, int]]
    garbage: list[tuple[str, int]]
    workers: list[dict[str, Any]]
    #: Why part of it could not be read (some shards' masters down), or "".
    partial: str = ""


def merge_promoted(results: list[PromoteResult]) -> PromoteResult:
    if len(results) == 1:
        return results[0]
    due = [(r.next_due_ms, r.next_due_in_us) for r in results if r.next_due_ms is not None]
    return PromoteResult(
        sum(r.moved for r in results), max(r.now_ms for r in results),
        min(d[0] for d in due) if due else None, min(d[1] or 0 for d in due) if due else None,
    )  # fmt: skip


def merge_stats(queue: str, parts: tuple[QueueStats, ...], live_workers: int | None) -> QueueStats:
    def least(values: Iterable[int | None]) -> int | None:
        present = [v for v in values if v is not None]
        return min(present) if present else None

    counters: dict[str, int] = {}
    for part in parts:
        for name, count in part.counters.items():
            counters[name] = counters.get(name, 0) + count
    return QueueStats(
        queue, max(p.now_ms for p in parts), sum(p.pending for p in parts),
        sum(p.overdue for p in parts), sum(p.ready for p in parts),
        sum(p.in_flight for p in parts), sum(p.expired_leases for p in parts),
        sum(p.garbage for p in parts), live_workers, least(p.next_due_ms for p in parts),
        least(p.oldest_lease_ms for p in parts), counters, parts,
    )  # fmt: skip
