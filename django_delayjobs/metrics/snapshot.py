"""One reading of the whole deployment: every queue's state and running totals.

Read from Redis (and, for the oldest ready job's due time, one primary-key lookup per
queue, waited for at most ``bounded.DATABASE_TIMEOUT_SECONDS``), never from per-process
memory: one scrape shows every worker process on every
host, whichever process serves it.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from .. import bounded, timing
from ..conf import delayjobs_settings
from ..engine import QueueStats
from ..engine.errors import EngineUnavailable, PartlyUnavailable, WrongType, guarded, unreachable
from ..models import Job
from ..queues import listed_queues
from . import layout, store

if TYPE_CHECKING:
    from ..engine import Engine

#: Entries at the head of ready looked at for a live id (the rest are tombstones).
READY_HEAD = 100


@dataclass(frozen=True)
class QueueReading:
    name: str
    stats: QueueStats
    totals: dict[str, float]
    oldest_overdue: float  # seconds
    actions: tuple[str, ...] = ()  # METRICS_ACTIONS when it was read

    def jobs(self, outcome: str) -> int:
        """``delayjobs_jobs_total`` of one outcome label."""
        counter = layout.ENGINE_OUTCOMES.get(outcome)
        if counter is not None:
            return self.stats.counters.get(counter, 0)
        return int(self.totals.get(f"jobs:{outcome}", 0))


#: The key of ``unreadable`` that says the directory of queues could not be read (not a
#: queue name: those have no spaces), so a queue may be missing from a scrape.
DIRECTORY = "directory of queues"


def queue_names(engine: Engine, unreadable: dict[str, str] | None = None) -> list[str]:
    """Every queue Redis has seen, the default queue and those of ``QUEUE_SHARDS``; if the
    directory cannot be read, why goes into ``unreadable`` under ``DIRECTORY`` (see
    ``queues.listed_queues``). (Not the database's queues: listing the queues of active
    rows reads an index of the whole table, too slow for every scrape.)"""
    names, unlisted = listed_queues(engine)
    if unlisted and unreadable is not None:
        unreadable[DIRECTORY] = unlisted
    return sorted(names)


def read(engine: Engine, unreadable: dict[str, str] | None = None) -> list[QueueReading]:
    """Read every queue that can be read; each one that cannot goes into ``unreadable``
    with why: a key of the wrong type (another program's: the queue page and
    ``delayjobs_health`` name an engine key, the worker's log a metrics key), or, on a
    Cluster, its master (or one of its shards') that does not answer, which must not hide
    the queues of the masters that do. A queue whose totals cannot be read (their master
    down, their key another program's) is read without them, and goes into ``unreadable``
    too. Raises ``EngineUnavailable`` if Redis is down (no queue could be read, and not
    for a wrong type)."""
    failed = {} if unreadable is None else unreadable
    names = queue_names(engine, failed)
    home_down: dict[str, str] = {}  # queues whose totals' master does not answer
    silent: dict[str, str] = {}  # Cluster masters that do not answer: asked no more
    totals = store.totals(engine, names, home_down, silent)
    failed.update(home_down)
    actions = tuple(delayjobs_settings.METRICS_ACTIONS)
    readings = []
    down: EngineUnavailable | None = None
    for name in names:
        if name in home_down and engine.shards(name) == [name]:
            continue  # every key of it is on that master: asking again would wait again
        if name not in totals and name not in home_down:  # another program's key
            failed[name] = f"its metrics totals key {store.totals_key(engine, name)} is not a hash"
        try:
            try:
                stats = engine.stats(name, silent)
            except PartlyUnavailable as exc:  # exported in part, marked unreadable
                stats, failed[name] = exc.done, str(exc)
            overdue = oldest_overdue(engine, stats)  # reads the ready list, which stats do not
        except EngineUnavailable as exc:
            failed[name] = str(exc)
            down = down or (None if isinstance(exc, WrongType) else exc)
            continue
        # Without its totals: its gauges, marked unreadable (``failed``), not its counters.
        readings.append(QueueReading(name, stats, totals.get(name, {}), overdue, actions))
    if down is not None and not readings:
        raise down
    return readings


def log_unreadable(logger: logging.Logger, unreadable: dict[str, str]) -> None:
    """Warn of the queues a scrape could not read (``read``), each with why."""
    for name, why in sorted(unreadable.items()):
        if name == DIRECTORY:
            logger.warning("metrics: %s", why)
        else:
            logger.warning("metrics: queue %r could not be read (%s)", name, why)


def oldest_overdue(
    engine: Engine,
    stats: QueueStats,
    down: dict[str, str] | None = None,
    before: Callable[[str], None] | None = None,
) -> float:
    """Seconds since the due time of the oldest job that is due and has not started:
    the head of pending if it is overdue (no promoter ran it), the oldest live id in
    ready (waiting for a worker), whose due time its row holds, or the oldest lease that
    ran out (its worker was lost, and no promoter has recovered it): since the lease's
    end. (When the first ``READY_HEAD`` entries of ready are all ids removed while ready,
    the oldest of up to as many of its live ids, picked at random.) With ``down`` (see
    ``Engine.stats``), the Cluster master of a shard whose ready list it could not read
    goes into it: that master alone, not every master of the queue. ``before`` is called
    with a shard's name before its ready list is read (it may raise: the health check
    stops there once given up on)."""
    ages: list[float] = [0]
    if stats.overdue and stats.next_due_ms is not None:
        ages.append(stats.now_ms - stats.next_due_ms)
    if stats.expired_leases and stats.oldest_lease_ms is not None:
        ages.append(stats.now_ms - stats.oldest_lease_ms)
    for shard in stats.shards or [stats]:  # a queue of several shards: each one's head
        if shard.ready:
            if before is not None:
                before(shard.queue)
            try:
                due_ms = _ready_head_due_ms(engine, shard.queue)
            except EngineUnavailable as exc:
                if down is not None and engine.is_cluster and unreachable(exc):
                    with contextlib.suppress(EngineUnavailable):  # a slot with no master
                        down.setdefault(engine.node_of(shard.queue), str(exc))
                raise
            if due_ms is not None:
                ages.append(stats.now_ms - due_ms)
    return max(ages) / 1000


def _ready_head_due_ms(engine: Engine, queue: str) -> float | None:
    keys = engine.keys(queue)

    def head() -> list[bytes | str]:  # str from a client that decodes its replies
        entries = cast(list[bytes | str], engine.client.lrange(keys.ready, 0, READY_HEAD - 1))
        live = engine.client.smismember(keys.ready_set, entries) if entries else []
        found = [e for e, ok in zip(entries, live, strict=True) if ok]
        if found:
            return found[:1]
        # Only ids removed while ready (cancelled, rescheduled) at its head: the oldest of
        # up to READY_HEAD of its live ids, a lower bound where "nothing waits" would lie.
        return cast(list[bytes | str], engine.client.srandmember(keys.ready_set, READY_HEAD))

    pks = []
    for entry in guarded(head):
        try:
            pks.append(uuid.UUID(entry.decode() if isinstance(entry, bytes) else entry))
        except ValueError:
            continue  # not a job id of ours
    if not pks:
        return None
    found = Job.objects.filter(pk__in=pks).order_by("run_at").values_list("run_at", flat=True)
    run_at = bounded.read(found.first)  # a database that hangs must not hold the scrape
    return None if run_at is None else timing.to_ms(run_at)
