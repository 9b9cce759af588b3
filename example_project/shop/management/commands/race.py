"""``manage.py race``: every order is paid at exactly the moment its auto-cancel is due.

Places ``--orders`` orders whose deadlines are spread over ``--spread`` seconds, starts
``--workers`` ``run_delayworker`` processes, pays each order at its job's ``run_at`` and
prints one JSON summary on stdout (progress goes to stderr). Each order must end either
paid with its job cancelled, or cancelled by its job (which succeeded) with the payment
refused; never both, and no payment may fail with anything else (a deadlock, say).
Exit status 0 only then. Meant for PostgreSQL (``DATABASE_URL``); runs on SQLite too.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection
from django.utils import timezone

from shop import simulation
from shop.models import Order
from shop.simulation import Payment, Progress, percentile


class Command(BaseCommand):
    help = "Pay orders exactly at their deadline while workers cancel them; print JSON."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--orders", type=int, default=200)
        parser.add_argument("--workers", type=int, default=2, help="Worker processes.")
        parser.add_argument("--concurrency", type=int, default=4, help="Threads per worker.")
        parser.add_argument(
            "--lead",
            type=simulation.seconds,
            default=3.0,
            help="Seconds from the end of placing to the first deadline.",
        )
        parser.add_argument(
            "--spread",
            type=simulation.seconds,
            default=None,
            help="Seconds over which the deadlines are spread (default: 50 ms per order, so "
            "that each payment can be made at its exact moment).",
        )
        parser.add_argument("--threads", type=int, default=16, help="Paying threads.")
        parser.add_argument(
            "--worker-log",
            type=Path,
            default=None,
            help="Default example_project/var/race-worker.log.",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        n = opts["orders"]
        if n < 1 or opts["workers"] < 1 or opts["concurrency"] < 1 or opts["threads"] < 1:
            raise CommandError("--orders, --workers, --concurrency and --threads must be >= 1")
        log = opts["worker_log"] or Path(settings.VAR_DIR) / "race-worker.log"
        simulation.migrate()
        stop_paying = threading.Event()
        with simulation.sigterm_interrupts(), simulation.redis_for_run() as redis_run:
            where = redis_run.description
            self.note(f"race: {n} orders, {simulation.describe_database()}, redis {where}")
            workers = simulation.start_workers(
                opts["workers"], redis_run.url, log, opts["concurrency"]
            )
            try:
                simulation.wait_until_ready(workers, log, redis_run=redis_run)
                spread = n * 0.05 if opts["spread"] is None else opts["spread"]
                ids, payments = self.place(n, opts["lead"], spread)
                self.note(f"race: placed {n} orders; paying each exactly at its deadline")
                payer = simulation.pay_in_background(payments, stop_paying, opts["threads"])
                finished = simulation.wait_for_outcomes(
                    ids, payments, workers, log, max(p.at for p in payments), self.progress,
                    redis_run=redis_run,
                )  # fmt: skip
                payer.join(10)
            finally:
                stop_paying.set()
                codes = simulation.stop_workers(workers)
        summary = self.summary(ids, payments, finished, codes, log)
        self.stdout.write(json.dumps(summary))
        if not summary["ok"]:
            raise CommandError("the race found faults; see the JSON summary")

    def place(self, n: int, lead: float, spread: float) -> tuple[list[int], list[Payment]]:
        # Deadlines are fixed before placing, far enough out for placing to finish first.
        first = timezone.now() + timedelta(seconds=lead + n * 0.02)
        step = timedelta(seconds=spread / max(1, n - 1)) if n > 1 else timedelta(0)
        orders = [
            Order.place(
                Decimal("10.00") + i,
                number=f"RACE-{first:%H%M%S%f}-{i:04d}",
                cancel_at=first + i * step,
                remind=False,  # the race is between the payment and the auto-cancel
            )
            for i in range(n)
        ]
        payments = [Payment(o.pk, o.auto_cancel_job.run_at.timestamp()) for o in orders]
        return [o.pk for o in orders], payments

    def summary(
        self,
        ids: list[int],
        payments: list[Payment],
        finished: bool,
        codes: list[int],
        log: Path,
    ) -> dict[str, Any]:
        results = simulation.results(ids, payments)
        verdicts = Counter(r.verdict() for r in results)
        faults = [
            f"{r.order.number}: {r.verdict()}" for r in results if r.verdict().startswith("FAULT")
        ]
        errors = [p.detail for p in payments if p.outcome == "error"]
        log_text = log.read_text(errors="replace") if log.exists() else ""
        lateness = [v for v in (r.lateness_ms for r in results) if v is not None]
        late_payments = [(p.paid_at - p.at) * 1000 for p in payments if p.paid_at]
        ok = (
            finished
            and not faults
            and not errors
            and all(c == 0 for c in codes)
            and "deadlock" not in log_text.lower()
        )
        return {
            "ok": ok,
            "orders": len(ids),
            "database": connection.vendor,
            "workers": len(codes),
            "finished": finished,
            "outcomes": {"paid": verdicts["paid"], "cancelled": verdicts["cancelled"]},
            "both_paid_and_cancelled": sum(
                r.order.paid_at is not None and r.order.cancelled_at is not None for r in results
            ),
            "fault_count": len(faults),
            "faults": faults[:20],
            "payment_errors": errors[:20],
            "deadlocks_in_worker_logs": log_text.lower().count("deadlock"),
            "worker_exit_codes": codes,
            "cancel_lateness_ms": self.spread(lateness),
            "payment_lateness_ms": self.spread(late_payments),
        }

    @staticmethod
    def spread(values: list[float]) -> dict[str, float] | None:
        if not values:
            return None
        return {
            "p50": round(percentile(values, 50), 2),
            "p99": round(percentile(values, 99), 2),
            "max": round(max(values), 2),
        }

    def progress(self, progress: Progress) -> None:
        if progress.done or progress.elapsed - getattr(self, "_last", -1.0) >= 1.0:
            self._last = progress.elapsed
            self.note(f"race: {progress.line()}")

    def note(self, text: str) -> None:
        self.stderr.write(text)
        self.stderr.flush()
