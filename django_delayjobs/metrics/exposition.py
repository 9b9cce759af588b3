"""The Prometheus text format of a snapshot, through ``prometheus_client``'s collector API.

Metric names and labels (bounded: a queue name and a fixed outcome or state, never a job
id, and an action only when the settings name it):

- ``delayjobs_jobs_total{queue,outcome}``: counter;
- ``delayjobs_lateness_seconds{queue}``: histogram of ``started_at - run_at``;
- ``delayjobs_run_seconds{queue}``: histogram of the action's duration;
- ``delayjobs_queue_jobs{queue,state}``: gauge of pending, overdue, ready, in_flight,
  garbage;
- ``delayjobs_oldest_overdue_seconds{queue}``, ``delayjobs_workers{queue}``: gauges;
- ``delayjobs_shard_jobs{queue,shard,state}``: the same states per shard, for the queues
  split into several (``QUEUE_SHARDS``; absent when none is);
- ``delayjobs_action_jobs_total{queue,action,outcome}`` and
  ``delayjobs_action_run_seconds{queue,action}``: the workers' outcomes and run times of
  the actions named in ``METRICS_ACTIONS`` (opt-in, so the labels stay bounded; absent
  when none is named or none of them ran);
- ``delayjobs_queue_readable{queue}``: gauge, 1 for each queue read, 0 for one that could
  not be (its master down, or a key of another program's type), which has no other series,
  or not whole: a queue split into shards some of whose masters are down has the gauges
  of the shards that answered (not its counters: a sum short of a shard would read as a
  reset), and so has one whose totals could not be read (their master down, or their
  key of another program's type); ``delayjobs_workers`` only when its heartbeats were
  read;
- ``delayjobs_directory_readable``: gauge, 0 when the directory of queues could not be
  read (its master down), so a queue known only to Redis may be missing; else 1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from . import layout
from .snapshot import DIRECTORY, QueueReading

#: The states of ``delayjobs_queue_jobs``, with the ``QueueStats`` field of each.
STATES = {"pending": "pending", "overdue": "overdue", "ready": "ready",
          "in_flight": "in_flight", "garbage": "garbage"}  # fmt: skip

CONTENT_TYPE = CONTENT_TYPE_LATEST


def families(readings: Sequence[QueueReading], unreadable: Iterable[str] = ()) -> list[Metric]:
    """Every metric family of a snapshot; each queue read has every series, zeros
    included, and each one in ``unreadable`` only ``delayjobs_queue_readable``."""
    jobs = CounterMetricFamily(
        "delayjobs_jobs", "Jobs by outcome: scheduled and cancelled as Redis took them; "
        "succeeded, failed (attempts whose action raised), retried, dead and skipped as "
        "workers recorded them.", labels=["queue", "outcome"],
    )  # fmt: skip
    lateness = HistogramMetricFamily(
        "delayjobs_lateness_seconds",
        "How late attempts started against their due time (started_at - run_at).",
        labels=["queue"],
    )
    run = HistogramMetricFamily("delayjobs_run_seconds", "How long actions ran.", labels=["queue"])
    states = GaugeMetricFamily(
        "delayjobs_queue_jobs", "Job ids Redis holds, by state.", labels=["queue", "state"]
    )
    overdue = GaugeMetricFamily(
        "delayjobs_oldest_overdue_seconds",
        "Seconds since the due time of the oldest job that is due and has not started.",
        labels=["queue"],
    )
    workers = GaugeMetricFamily(
        "delayjobs_workers", "Live worker processes serving the queue.", labels=["queue"]
    )
    shards = GaugeMetricFamily(
        "delayjobs_shard_jobs", "Job ids Redis holds per shard of a queue split into "
        "several (QUEUE_SHARDS), by state.", labels=["queue", "shard", "state"],
    )  # fmt: skip
    action_jobs = CounterMetricFamily(
        "delayjobs_action_jobs", "Jobs by outcome, as workers recorded them, of the actions "
        "named in METRICS_ACTIONS.", labels=["queue", "action", "outcome"],
    )  # fmt: skip
    action_run = HistogramMetricFamily(
        "delayjobs_action_run_seconds", "How long the actions named in METRICS_ACTIONS ran.",
        labels=["queue", "action"],
    )  # fmt: skip
    readable = GaugeMetricFamily(
        "delayjobs_queue_readable", "1 if the queue could be read, 0 if not (its Redis "
        "Cluster master is down, or a key of it holds another program's type).",
        labels=["queue"],
    )  # fmt: skip
    unread = set(unreadable) - {DIRECTORY}
    directory = GaugeMetricFamily(
        "delayjobs_directory_readable", "1 if the directory of queues could be read, 0 if "
        "not (its Redis Cluster master is down): a queue known only to Redis may be missing.",
    )  # fmt: skip
    directory.add_metric([], 0 if DIRECTORY in unreadable else 1)
    for name in sorted(unread - {r.name for r in readings}):
        readable.add_metric([name], 0)
    for r in readings:
        readable.add_metric([r.name], 0 if r.name in unread else 1)
        for state, field in STATES.items():
            states.add_metric([r.name, state], getattr(r.stats, field))
        overdue.add_metric([r.name], r.oldest_overdue)
        if r.stats.live_workers is not None:  # unknown: their master is down
            workers.add_metric([r.name], r.stats.live_workers)
        for shard in r.stats.shards:
            for state, field in STATES.items():
                shards.add_metric([r.name, shard.queue, state], getattr(shard, field))
        if r.name in unread:
            continue  # read in part: counters short of a shard would read as a reset
        for action in r.actions:
            fields = layout.action_fields(r.totals, action)
            if not fields:
                continue
            for outcome in layout.WORKER_OUTCOMES:
                action_jobs.add_metric([r.name, action, outcome], fields.get(f"jobs:{outcome}", 0))
            action_run.add_metric([r.name, action], _cumulative("run", fields),
                                  fields.get("run:sum", 0))  # fmt: skip
        for outcome in layout.OUTCOMES:
            jobs.add_metric([r.name, outcome], r.jobs(outcome))
        for family, name in ((lateness, "lateness"), (run, "run")):
            family.add_metric([r.name], _cumulative(name, r.totals), r.totals.get(f"{name}:sum", 0))
    found = [jobs, lateness, run, states, overdue, workers, readable, directory]
    return found + [f for f in (shards, action_jobs, action_run) if f.samples]


def _cumulative(histogram: str, totals: dict[str, float]) -> list[tuple[str, float]]:
    seen = 0
    out: list[tuple[str, float]] = []
    for bound, n in layout.buckets(histogram, totals):
        seen += n
        out.append((layout.bound_label(bound), seen))
    return out


class DeploymentCollector(Collector):
    """Reads a fresh snapshot on every scrape."""

    def __init__(self, read: Callable[[], list[Metric]]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        yield from self.read()


def registry(read: Callable[[], list[Metric]]) -> CollectorRegistry:
    """A registry holding only the deployment's metrics (no process or GC metrics: they
    would describe whichever process served the scrape, not the deployment)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(DeploymentCollector(read))
    return reg


def render(readings: Sequence[QueueReading], unreadable: Iterable[str] = ()) -> bytes:
    """The text exposition of a snapshot (and of the queues that could not be read)."""
    return generate_latest(registry(lambda: families(readings, unreadable)))
