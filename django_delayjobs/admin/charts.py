"""The queue page's charts: throughput (jobs per minute by outcome) and lateness (p50 and
p99 per minute) over the last ``METRICS_HISTORY_HOURS``, drawn as inline SVG.

Python computes every coordinate; the template (``includes/charts.html``) only writes
them out, so the page needs no JavaScript and no library. Colours are CSS variables with
light and dark values, so the charts follow the admin's theme. Each chart has a table of
its numbers for screen readers (and anyone who wants the figures).
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from django.utils import formats, timezone
from django.utils.translation import gettext as _

from ..conf import delayjobs_settings
from ..connection import get_engine
from ..metrics import history
from ..metrics.snapshot import queue_names
from ..queues import QueueState

WIDTH, HEIGHT = 720, 190
LEFT, RIGHT, TOP, BOTTOM = 52, 10, 10, 24
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
#: The lateness axis (log scale): below 1 ms is drawn at 1 ms, above 60 s at 60 s.
LOW, HIGH = 0.001, 60.0
LATENESS_TICKS = ((0.001, "1 ms"), (0.01, "10 ms"), (0.1, "100 ms"), (1.0, "1 s"),
                  (10.0, "10 s"), (60.0, "60 s"))  # fmt: skip


@dataclass
class Mark:
    series: str
    x: float
    y: float
    w: float = 0.0
    h: float = 0.0


@dataclass
class Tick:
    at: float
    label: str


@dataclass
class Chart:
    id: str
    title: str
    summary: str  # what the chart shows, in one sentence (the SVG's description)
    legend: list[tuple[str, str]]  # (series, label)
    bars: list[Mark] = field(default_factory=list)
    lines: list[tuple[str, str]] = field(default_factory=list)  # (series, SVG points)
    dots: list[Mark] = field(default_factory=list)
    y_ticks: list[Tick] = field(default_factory=list)
    x_ticks: list[Tick] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)  # minutes with data only
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    top: int = TOP
    right: int = LEFT + PLOT_W
    bottom: int = TOP + PLOT_H
    label_y: int = HEIGHT - 7  # the baseline of the time labels


@dataclass
class Charts:
    queue: str | None  # None: every queue
    queues: list[str]
    hours: int
    charts: list[Chart]
    #: Queues left out, with why: on a Cluster, their history's master does not answer.
    missing: dict[str, str] = field(default_factory=dict)


def build(
    chosen: str | None,
    names: list[str] | None = None,
    states: Sequence[QueueState] = (),
    down: dict[str, str] | None = None,
) -> Charts:
    """Read the history of ``chosen`` (a queue, or None for all) and lay out both charts.
    ``names``: every queue, ``states``: those read already (their counters and Redis's
    clock are not read again); ``down``: as in ``Engine.stats``. Raises
    ``EngineUnavailable`` if Redis is down, or the chosen queue's history cannot be read;
    on a Cluster with a master down, the other queues are drawn (see ``history.read``)."""
    engine = get_engine()
    names = queue_names(engine) if names is None else names
    queue = chosen if chosen in names else None
    hours = delayjobs_settings.METRICS_HISTORY_HOURS
    now = max((s.stats.now_ms for s in states), default=None)
    missing: dict[str, str] = {}
    minutes = history.read(
        engine, [queue] if queue else names, hours * 60,
        now=None if now is None else now // 60_000,
        # A queue read in part: its counters' sum lacks the shards that did not answer.
        counters={s.name: {} if s.missing else s.stats.counters for s in states},
        unreadable=missing, down=down,
    )  # fmt: skip
    labels = [_label(m.minute) for m in minutes]
    ticks = _x_ticks(minutes)
    charts = [throughput(minutes, labels), lateness(minutes, labels)]
    for chart in charts:
        chart.x_ticks = ticks
    return Charts(queue, names, hours, charts, dict(sorted(missing.items())))


def _label(minute: int) -> str:
    at = datetime.datetime.fromtimestamp(minute * 60, tz=datetime.UTC)
    return formats.time_format(timezone.localtime(at), "H:i")


def _x(i: int, n: int) -> float:
    return LEFT + PLOT_W * i / n


def _x_ticks(minutes: Sequence[history.Minute]) -> list[Tick]:
    n = len(minutes)
    step = next(s for s in (15, 30, 60, 120, 180, 360, 720) if n / s <= 8)
    return [Tick(round(_x(i, n), 1), _label(m.minute))
            for i, m in enumerate(minutes) if m.minute % step == 0]  # fmt: skip


def _nice_top(value: float) -> int:
    """The smallest of 1, 2, 5 times a power of ten at or above ``value`` (at least 5)."""
    value = max(value, 5)
    power = 10 ** math.floor(math.log10(value))
    return int(next(m * power for m in (1, 2, 5, 10) if m * power >= value))


def throughput(minutes: Sequence[history.Minute], labels: Sequence[str]) -> Chart:
    names = {
        "succeeded": _("succeeded"), "skipped": _("skipped"), "retried": _("retried"),
        "dead": _("dead"), "scheduled": _("scheduled"), "cancelled": _("cancelled"),
    }  # fmt: skip
    chart = Chart(
        "delayjobs-throughput", _("Jobs per minute"),
        _("Jobs per minute by outcome: bars stack succeeded, skipped, retried and dead "
          "jobs; lines show scheduled and cancelled jobs."),
        legend=list(names.items()),
    )  # fmt: skip
    n = len(minutes)
    top = _nice_top(max((max(sum(m.jobs.get(s, 0) for s in history.STACKED),
                             *(m.jobs.get(s, 0) for s in history.LINES)) for m in minutes),
                        default=0))  # fmt: skip
    scale = PLOT_H / top
    width = max(PLOT_W / n - 1, 0.5)
    for i, m in enumerate(minutes):
        base = float(TOP + PLOT_H)
        for series in history.STACKED:
            h = m.jobs.get(series, 0) * scale
            if h:
                base -= h
                chart.bars.append(Mark(series, round(_x(i, n), 1), round(base, 1),
                                       round(width, 1), round(h, 1)))  # fmt: skip
    for series in history.LINES:
        points = [(_x(i, n) + width / 2, TOP + PLOT_H - m.jobs.get(series, 0) * scale)
                  for i, m in enumerate(minutes)]  # fmt: skip
        if any(m.jobs.get(series) for m in minutes):
            chart.lines.append((series, " ".join(f"{x:.1f},{y:.1f}" for x, y in points)))
    chart.y_ticks = [Tick(round(TOP + PLOT_H - v * scale, 1), str(v))
                     for v in (0, top // 2, top)]  # fmt: skip
    chart.columns = [_("Minute"), *names.values()]
    order = [*history.STACKED, *history.LINES]
    chart.rows = [[label, *(str(m.jobs.get(s, 0)) for s in order)]
                  for label, m in zip(labels, minutes, strict=True) if m.jobs]  # fmt: skip
    return chart


def _y_log(seconds: float) -> float:
    clamped = min(max(seconds, LOW), HIGH)
    share = math.log10(clamped / LOW) / math.log10(HIGH / LOW)
    return round(TOP + PLOT_H * (1 - share), 1)


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def lateness(minutes: Sequence[history.Minute], labels: Sequence[str]) -> Chart:
    chart = Chart(
        "delayjobs-lateness", _("Lateness"),
        _("How late jobs started against their due time, per minute: the median (p50) "
          "and the 99th percentile (p99), on a logarithmic scale from 1 ms to 60 s."),
        legend=[("p50", _("p50 (median)")), ("p99", _("p99"))],
    )  # fmt: skip
    n = len(minutes)
    quantiles = [(m.quantile(0.5), m.quantile(0.99)) for m in minutes]
    for k, series in enumerate(("p50", "p99")):
        run: list[tuple[float, float]] = []
        for i, pair in enumerate([*quantiles, (None, None)]):
            value = pair[k]
            if value is not None:
                run.append((round(_x(i, n) + PLOT_W / n / 2, 1), _y_log(value)))
                continue
            if len(run) == 1:  # a lone minute: a dot, since a line needs two points
                chart.dots.append(Mark(series, *run[0]))
            elif run:
                chart.lines.append((series, " ".join(f"{x},{y}" for x, y in run)))
            run = []
    chart.y_ticks = [Tick(_y_log(v), label) for v, label in LATENESS_TICKS]
    chart.columns = [_("Minute"), _("Jobs started"), _("p50"), _("p99")]
    chart.rows = [[label, str(m.started), _seconds(p50), _seconds(p99)]
                  for label, m, (p50, p99) in zip(labels, minutes, quantiles, strict=True)
                  if m.started]  # fmt: skip
    return chart
