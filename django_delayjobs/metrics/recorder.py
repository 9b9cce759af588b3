"""Tally outcomes in the worker process, flush them to Redis about once a second.

A worker thread drains over a thousand jobs a second, so ``record`` touches no socket: it
adds to a few dict entries under a lock (a couple of microseconds). The housekeeping
thread calls ``flush`` about once a second, which writes everything tallied since the
last flush in one MULTI/EXEC per queue. Counts are therefore up to a second late in Redis,
and a process killed with SIGKILL loses at most its last second of counts.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ..conf import delayjobs_settings
from ..engine.errors import EngineUnavailable
from . import layout, store

if TYPE_CHECKING:
    from ..engine import Engine
    from ..outcomes import Result

logger = logging.getLogger("django_delayjobs.metrics")

Tally = defaultdict[str, float]
#: (queue, minute) -> field -> increment; minute None is the running totals.
Tallies = dict[tuple[str, int | None], Tally]

#: The label a worker outcome is counted under (``Outcome`` value -> label).
_LABELS = {"succeeded": "succeeded", "retrying": "retried", "dead": "dead", "skipped": "skipped"}
#: The fields that count deliveries, one per outcome (``failed`` is one of their attempts).
_OUTCOME_FIELDS = {f"jobs:{label}" for label in _LABELS.values()}


def fields_of(result: Result) -> list[tuple[str, float]]:
    """The (field, increment) pairs one delivery adds.

    - ``succeeded``, ``retried`` (failed, another attempt is due), ``dead``, ``skipped``:
      one per delivery with that outcome;
    - ``failed``: one per attempt whose action raised (then retried, or dead);
    - lateness (``started_at - run_at`` of the attempt) and run seconds: one observation
      per attempt whose action ran, whatever its outcome.

    Deliveries that change nothing (dropped, deferred, handed back, overtaken, unclaimed)
    add nothing.
    """
    pairs: list[tuple[str, float]] = []
    label = _LABELS.get(result.outcome.value)
    if label is not None:
        pairs.append((f"jobs:{label}", 1))
    if result.failed:
        pairs.append(("jobs:failed", 1))
    job = result.job
    if result.duration is not None and job is not None and job.started_at is not None:
        # Never negative: a worker does not start an attempt before its run_at (a host
        # clock behind the one that scheduled it can make it look so).
        lateness = max(0.0, (job.started_at - job.run_at).total_seconds())
        run = result.duration
        # Redis refuses to add inf or NaN, and one such value would fail every flush.
        if math.isfinite(run):
            run = max(0.0, run)
            pairs += [(layout.bucket_field("lateness", lateness), 1), ("lateness:sum", lateness)]
            pairs += [(layout.bucket_field("run", run), 1), ("run:sum", run)]
    return pairs


def action_pairs(result: Result, pairs: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """The per-action copies of ``pairs`` (outcomes and run time) when the job's action is
    named in ``METRICS_ACTIONS``; none otherwise."""
    job = result.job
    if job is None or job.action not in delayjobs_settings.METRICS_ACTIONS:
        return []
    return [(layout.action_field(job.action, name), amount) for name, amount in pairs
            if not name.startswith("lateness:")]  # fmt: skip


class Recorder:
    """This process's counts not yet in Redis (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # One flush at a time: the last flush of a process that stops must wait for the
        # housekeeping thread's, whose counts are taken and not yet written (or given back).
        self.flushing = threading.Lock()
        self.tallies: Tallies = {}
        self.snapped: dict[str, int] = {}  # queue -> last minute whose snapshot was taken

    def record(self, queue: str, result: Result, now: float | None = None) -> None:
        pairs = fields_of(result)
        if not pairs:
            return
        minute = int((time.time() if now is None else now) // 60)
        per_action = action_pairs(result, pairs)  # the running totals only
        with self.lock:
            for key, adds in (((queue, None), pairs + per_action), ((queue, minute), pairs)):
                tally = self.tallies.get(key)
                if tally is None:
                    tally = self.tallies[key] = defaultdict(float)
                for name, amount in adds:
                    tally[name] += amount

    def take(self) -> Tallies:
        with self.lock:
            taken, self.tallies = self.tallies, {}
        return taken

    def give_back(self, tallies: Mapping[tuple[str, int | None], Mapping[str, float]]) -> None:
        """Keep counts a failed flush could not write, for the next flush."""
        with self.lock:
            for key, tally in tallies.items():
                mine = self.tallies.setdefault(key, defaultdict(float))
                for name, amount in tally.items():
                    mine[name] += amount

    def flush(self, engine: Engine, queues: Sequence[str], now: float | None = None) -> None:
        """Write what was tallied to Redis; snapshot the engine counters of ``queues`` once
        a minute. Raises ``EngineUnavailable`` (the counts of the queues not written are kept
        for the next try)."""
        with self.flushing:
            self._flush(engine, queues, now)

    def _flush(self, engine: Engine, queues: Sequence[str], now: float | None) -> None:
        now = time.time() if now is None else now
        minute = int(now // 60)
        history = int(delayjobs_settings.METRICS_HISTORY_HOURS * 60)
        # Minutes that would expire at once are dropped (a flush failing for hours).
        tallies = {k: t for k, t in self.take().items() if k[1] is None or k[1] > minute - history}
        snap = [q for q in queues if self.snapped.get(q) != minute]
        written: set[str] = set()
        snapped: set[str] = set()
        refused: store.Increments = {}
        try:
            store.write(engine, tallies, snap, minute, ttl=history * 60 + 120, written=written,
                        refused=refused, snapped=snapped)  # fmt: skip
        finally:
            # Only the queues not written, and what Redis refused of the others: the rest
            # is in Redis already, and giving it back would add it again at every flush.
            self.give_back({k: t for k, t in tallies.items() if k[0] not in written})
            self.give_back(refused)
            for queue in snapped:
                self.snapped[queue] = minute


#: The one recorder of this process.
RECORDER = Recorder()


def record(queue: str, result: Result) -> None:
    """Count one delivery's outcome (cheap: no I/O)."""
    RECORDER.record(queue, result)


def flush(engine: Engine, queues: Sequence[str]) -> None:
    """Write this process's counts to Redis. Raises ``EngineUnavailable``."""
    RECORDER.flush(engine, queues)


def last_flush(engine: Engine, queues: Sequence[str], recorder: Recorder = RECORDER) -> None:
    """The flush of a process that stops: what it cannot write is lost with the process,
    so one warning says how many outcomes. Never raises for Redis."""
    try:
        recorder.flush(engine, queues)
    except EngineUnavailable as exc:
        with recorder.lock:
            lost = sum(int(n) for (_, at), tally in recorder.tallies.items() if at is None
                       for name, n in tally.items() if name in _OUTCOME_FIELDS)  # fmt: skip
        if lost:
            logger.warning("the counts of %d outcome(s) could not be written to Redis (%s): "
                           "they are lost with this process", lost, exc)  # fmt: skip
