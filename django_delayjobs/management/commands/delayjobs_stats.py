"""``manage.py delayjobs_stats``: the state of every queue as a plain table."""

from __future__ import annotations

import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...connection import get_engine
from ...engine import DelayJobsError, QueueStats

COLUMNS = ("queue", "pending", "overdue", "ready", "in_flight", "garbage", "next_due", "workers")


def _when(ms: int | None, now_ms: int) -> str:
    if ms is None:
        return "-"
    at = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return f"{at:%Y-%m-%d %H:%M:%S} ({(ms - now_ms) / 1000:+.1f}s)"


def row(s: QueueStats) -> tuple[str, ...]:
    return (s.queue, str(s.pending), str(s.overdue), str(s.ready), str(s.in_flight),
            str(s.garbage), _when(s.next_due_ms, s.now_ms), str(s.live_workers))  # fmt: skip


class Command(BaseCommand):
    help = "Print pending, overdue, ready, in flight, garbage, next due and live workers."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("queues", nargs="*", help="Queues to show (default: all known).")

    def handle(self, *args: Any, **options: Any) -> None:
        engine = get_engine()
        try:
            queues = options["queues"] or engine.known_queues()
            rows = [COLUMNS, *(row(engine.stats(q)) for q in queues)]
        except (DelayJobsError, ValueError, TypeError) as exc:
            raise CommandError(str(exc)) from exc
        widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
        for r in rows:
            self.stdout.write(
                "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
            )
