"""Per-minute history for the admin's charts: jobs by outcome and lateness quantiles.

Read from the per-minute hashes the workers flush (``layout``), summed over the chosen
queues. Scheduled and cancelled jobs per minute are the difference between two minutes'
snapshots of the engine's ``added``/``removed`` counters (for the current minute, the
counters' value now); a minute whose snapshots are missing (no worker ran) shows none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..engine.errors import EngineUnavailable, WrongType
from . import layout, store

if TYPE_CHECKING:
    from ..engine import Engine

#: The throughput chart's series, bottom of the stack first, then the lines.
STACKED = ("succeeded", "skipped", "retried", "dead")
LINES = ("scheduled", "cancelled")


@dataclass
class Minute:
    minute: int  # Unix seconds // 60
    jobs: dict[str, int] = field(default_factory=dict)
    lateness: dict[str, float] = field(default_factory=dict)  # bucket fields, summed

    @property
    def started(self) -> int:
        """Attempts whose action ran in this minute (the lateness observations)."""
        return sum(n for _, n in layout.buckets("lateness", self.lateness))

    def quantile(self, q: float) -> float | None:
        return layout.quantile(q, layout.buckets("lateness", self.lateness))


def read(
    engine: Engine,
    queues: Sequence[str],
    count: int,
    now: int | None = None,
    counters: Mapping[str, dict[str, int]] | None = None,
    unreadable: dict[str, str] | None = None,
    down: dict[str, str] | None = None,
) -> list[Minute]:
    """The last ``count`` minutes up to ``now`` (a minute; default: the current one, by
    Redis's clock), summed over ``queues``; ``counters``: the engine counters of queues
    read already (``QueueStats.counters``; {} for those not known in full), the others'
    are read here.

    On a Cluster with a master down, the queues whose history is on it are left out (with
    why in ``unreadable``) as long as another master answers; a queue whose counters can
    be read only in part (a shard's master down) is drawn without the current minute's
    scheduled and cancelled jobs. ``down``: as in ``Engine.stats``."""
    now = engine.server_time_ms() // 60_000 if now is None else now
    first = now - count + 1
    minutes = [Minute(m) for m in range(first, now + 1)]
    every = store.minutes_of(engine, queues, first, now, unreadable, down)
    for queue in (q for q in queues if q in every):
        found = every[queue]
        try:
            current = (counters or {}).get(queue)
            current = engine.stats(queue, down).counters if current is None else current
        except WrongType:  # a key of that queue another program wrote: shown on the page
            current = {}
        except EngineUnavailable:  # a shard's master down: a short sum would read as a drop
            if not engine.is_cluster:
                raise
            current = {}
        for m in minutes:
            fields = found.get(m.minute, {})
            for outcome in layout.WORKER_OUTCOMES:
                if fields.get(f"jobs:{outcome}"):
                    m.jobs[outcome] = m.jobs.get(outcome, 0) + int(fields[f"jobs:{outcome}"])
            for name, value in fields.items():
                if name.startswith("lateness:") and name != "lateness:sum":
                    m.lateness[name] = m.lateness.get(name, 0) + value
        _engine_counts(minutes, found, current)
    return minutes


def _engine_counts(
    minutes: list[Minute], found: dict[int, store.Fields], current: dict[str, int]
) -> None:
    """Add one queue's scheduled/cancelled per minute, from its snapshots."""
    for outcome, counter in layout.ENGINE_OUTCOMES.items():
        snap = layout.SNAPSHOT_FIELDS[counter]
        at: dict[int, float] = {}
        for minute, fields in found.items():
            if snap in fields:
                at[minute] = fields[snap]
        for i, m in enumerate(minutes):
            if m.minute not in at:
                continue
            last = i == len(minutes) - 1
            following = current.get(counter) if last else at.get(m.minute + 1)
            if following is None:
                continue
            # A drop means Redis lost its counters (a restart without persistence).
            n = int(following - at[m.minute]) if following >= at[m.minute] else int(following)
            if n:
                m.jobs[outcome] = m.jobs.get(outcome, 0) + n
