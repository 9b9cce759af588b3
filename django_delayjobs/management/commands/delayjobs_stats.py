"""``manage.py delayjobs_stats``: the state of every queue as a plain table.

A queue of several shards gets a row of totals, then one row per shard (indented); on a
Redis Cluster the last column names the master that holds each shard.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError

from ...connection import get_engine
from ...engine import DelayJobsError, Engine, QueueStats, WrongType
from ...queues import ms_datetime
from ..output import SafeOutputCommand

COLUMNS = (
    "queue", "pending", "overdue", "ready", "in_flight", "garbage", "next_due", "workers",
    "master",
)  # fmt: skip


def _when(ms: int | None, now_ms: int) -> str:
    if ms is None:
        return "-"
    at = ms_datetime(ms)
    return f"{at:%Y-%m-%d %H:%M:%S} ({(ms - now_ms) / 1000:+.1f}s)"


def row(
    s: QueueStats, name: str | None = None, workers: str = "", master: str = ""
) -> tuple[str, ...]:
    return (name or s.queue, str(s.pending), str(s.overdue), str(s.ready), str(s.in_flight),
            str(s.garbage), _when(s.next_due_ms, s.now_ms), workers or str(s.live_workers),
            master or "-")  # fmt: skip


def rows(engine: Engine, queue: str) -> list[tuple[str, ...]]:
    """The queue's row, then (for a queue of several shards) one row per shard."""
    stats = engine.stats(queue)
    if not stats.shards:
        return [row(stats, master=engine.node_of(queue))]
    return [row(stats)] + [
        row(shard, f"  {shard.queue}", "-", engine.node_of(shard.queue)) for shard in stats.shards
    ]


class Command(SafeOutputCommand):
    help = "Print pending, overdue, ready, in flight, garbage, next due and live workers."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("queues", nargs="*", help="Queues to show (default: all known).")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            engine = get_engine()
            # Each once, in the order given (``--queues a,a`` of the others does the same).
            queues = list(dict.fromkeys(options["queues"])) or engine.known_queues()
            table: list[tuple[str, ...]] = [COLUMNS]
            broken: list[str] = []
            for queue in queues:
                try:
                    table += rows(engine, queue)
                except WrongType as exc:  # that queue alone: the others are shown
                    broken.append(f"{queue}: {exc}")
        except (DelayJobsError, ValueError, TypeError) as exc:
            raise CommandError(str(exc)) from exc
        widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS))]
        for r in table:
            self.stdout.write(
                "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
            )
        if broken:
            raise CommandError("cannot read queue " + "; queue ".join(broken))
