"""What is counted and where it is kept: outcome labels, histogram buckets, Redis fields.

Pure Python (no Django, no Redis): the recorder, the store, the exposition and the admin's
charts all read these names, so a field is spelled once.

Redis, per queue (every key shares the queue's hash tag ``{<prefix>:<queue>}``, so one
Redis Cluster slot, like the engine's own keys):

``{<prefix>:<queue>}:metrics``            HASH of running totals, never expires
``{<prefix>:<queue>}:metrics:<minute>``   HASH of one minute's counts (minute = Unix
                                          seconds // 60), expires after HISTORY_HOURS

Fields: ``jobs:<outcome>`` (int), ``lateness:<le>`` and ``run:<le>`` (int, the count of
observations in the bucket whose upper bound is ``<le>``: per bucket, not cumulative),
``lateness:sum`` and ``run:sum`` (float seconds). The totals also hold, for each action
named in ``METRICS_ACTIONS``, its ``jobs:<outcome>``, ``run:<le>`` and ``run:sum`` as
``action|<name>|<field>``. A minute's hash also holds
``snap:added`` and ``snap:removed``: the engine's ``added``/``removed`` counters as the
first flush of that minute found them, so the charts can show scheduled and cancelled
jobs per minute (the difference between two minutes' snapshots).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

#: Outcomes a worker records (``delayjobs_jobs_total{outcome=...}``).
WORKER_OUTCOMES = ("succeeded", "failed", "retried", "dead", "skipped")
#: Outcomes counted by the engine's scripts in web processes, with their counter field.
ENGINE_OUTCOMES = {"scheduled": "added", "cancelled": "removed"}
#: Every value of the ``outcome`` label, in the issue's order.
OUTCOMES = ("succeeded", "failed", "retried", "dead", "skipped", "cancelled", "scheduled")

#: How late a job starts against its due time: 1 ms to 60 s.
LATENESS_BUCKETS: tuple[float, ...] = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0,
)  # fmt: skip
#: How long an action runs: 1 ms to 5 minutes.
RUN_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
)  # fmt: skip
HISTOGRAMS = {"lateness": LATENESS_BUCKETS, "run": RUN_BUCKETS}

TOTALS_SUFFIX = "metrics"
SNAPSHOT_FIELDS = {"added": "snap:added", "removed": "snap:removed"}

#: ``METRICS_ACTIONS``: at most this many actions have series of their own.
MAX_ACTIONS = 50
#: An action's name as the job's ``action`` column holds it: ``module.function``,
#: ``app_label.Model.method`` or, for django.tasks, ``task:module.function``.
_ACTION = re.compile(r"[A-Za-z_][A-Za-z0-9_.:]*")
MAX_ACTION_LENGTH = 200


def check_actions(value: object) -> None:
    """Check the ``METRICS_ACTIONS`` setting: at most ``MAX_ACTIONS`` action names, each
    once (a name given twice would give its series twice)."""
    if not isinstance(value, list | tuple) or not all(isinstance(n, str) for n in value):
        raise TypeError(f"must be a list of action names, not {value!r}")
    if len(value) > MAX_ACTIONS:
        raise ValueError(f"names {len(value)} actions: at most {MAX_ACTIONS} (each adds series)")
    for name in value:
        if len(name) > MAX_ACTION_LENGTH or not _ACTION.fullmatch(name):
            raise ValueError(
                f"{name!r} is not an action name (module.function, app_label.Model.method "
                f"or task:module.function; at most {MAX_ACTION_LENGTH} characters)"
            )
    if len(set(value)) < len(value):
        raise ValueError(f"names an action more than once: {value!r}")


def action_field(action: str, field: str) -> str:
    return f"action|{action}|{field}"


def action_fields(totals: Mapping[str, float], action: str) -> dict[str, float]:
    """The fields of one action in a queue's totals, without their prefix."""
    prefix = action_field(action, "")
    return {k[len(prefix) :]: v for k, v in totals.items() if k.startswith(prefix)}


def bound_label(bound: float) -> str:
    """The text of a bucket bound, as Prometheus writes ``le`` (``+Inf`` for the last)."""
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def bucket_field(histogram: str, value: float) -> str:
    """The field of the bucket ``value`` (seconds) falls in: the first bound >= value."""
    for bound in HISTOGRAMS[histogram]:
        if value <= bound:
            return f"{histogram}:{bound_label(bound)}"
    return f"{histogram}:+Inf"


def buckets(histogram: str, fields: Mapping[str, float]) -> list[tuple[float, int]]:
    """Per-bucket counts of ``histogram`` in a hash, in bound order, ``+Inf`` last."""
    bounds: Sequence[float] = (*HISTOGRAMS[histogram], math.inf)
    return [(b, int(fields.get(f"{histogram}:{bound_label(b)}", 0))) for b in bounds]


def quantile(q: float, counts: Sequence[tuple[float, int]]) -> float | None:
    """Estimate the ``q`` quantile from per-bucket counts, as PromQL's
    ``histogram_quantile`` does: linear within the bucket, from 0 below the first bound.
    None when nothing was observed; the highest finite bound when the rank falls past it.
    """
    total = sum(n for _, n in counts)
    if total == 0:
        return None
    rank = q * total
    seen, lower = 0, 0.0
    for bound, n in counts:
        if n and seen + n >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - seen) / n
        seen += n
        if not math.isinf(bound):
            lower = bound
    return lower
