"""``manage.py demo``: orders that cancel themselves unless paid, shown end to end.

Migrates, starts a private Redis (unless ``REDIS_URL`` is set) and a real
``run_delayworker`` process, places orders whose auto-cancel is due in a few seconds,
pays half of them at random moments before their deadline and a few exactly at it, waits
for every job to finish and prints a report. Exit status 0 only if every unpaid order was
cancelled and no paid order was.
"""

from __future__ import annotations

import os
import random
import shlex
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.urls import NoReverseMatch, reverse

from shop import simulation
from shop.models import Order
from shop.simulation import Payment, Progress, Result, percentile


def positive(kind: type[int]) -> Any:
    def parse(text: str) -> int:
        value = kind(text)
        if not value > 0:
            raise ValueError(text)
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its error message
    return parse


@dataclass
class Plan:
    run: str  # names this run's orders: DEMO-<run>-001 ...
    orders: int
    deadline: float  # seconds from placing an order to its auto-cancel
    arrivals: float  # seconds over which the orders are placed
    paid_in_time: int
    at_deadline: int

    @property
    def unpaid(self) -> int:
        return self.orders - self.paid_in_time - self.at_deadline


class Command(BaseCommand):
    help = "Run the example shop demo: timed auto-cancels, payments, races, and a report."

    def add_arguments(self, parser: CommandParser) -> None:
        add = parser.add_argument
        add("--orders", type=positive(int), default=40, help="Orders to place (default 40).")
        add("--deadline", type=simulation.deadline_seconds, default=5.0,
            help="Seconds an order may stay unpaid (default 5, at least 1).")  # fmt: skip
        add("--at-deadline", type=int, default=None,
            help="Orders paid exactly at their deadline (default: a tenth, min 1).")  # fmt: skip
        add("--arrivals", type=simulation.seconds, default=2.0,
            help="Seconds over which orders come in (default 2, at most deadline/2).")  # fmt: skip
        add("--workers", type=positive(int), default=1,
            help="run_delayworker processes (default 1).")  # fmt: skip
        add("--concurrency", type=positive(int), default=1,
            help="Threads per worker process (default 1).")  # fmt: skip
        add("--seed", type=int, default=None, help="Random seed.")
        add("--worker-log", type=Path, default=None,
            help="The workers' log (default example_project/var/demo-worker.log).")  # fmt: skip

    def handle(self, *args: Any, **opts: Any) -> None:
        n, deadline = opts["orders"], opts["deadline"]
        paid_in_time = n // 2
        at_deadline = max(1, n // 10) if opts["at_deadline"] is None else opts["at_deadline"]
        if not 0 <= at_deadline <= n - paid_in_time:
            raise CommandError(f"--at-deadline must be between 0 and {n - paid_in_time}")
        plan = Plan(
            run=uuid.uuid4().hex[:6],
            orders=n,
            deadline=deadline,
            # Payments start once every order is placed: keep that well before a deadline.
            arrivals=max(0.0, min(opts["arrivals"], deadline / 2)),
            paid_in_time=paid_in_time,
            at_deadline=at_deadline,
        )
        self.rng = random.Random(opts["seed"])
        self.tty = self.stdout.isatty()
        self.last_line = -1.0
        self.width = 0
        log = opts["worker_log"] or Path(settings.VAR_DIR) / "demo-worker.log"

        self.say(
            f"django-delayjobs demo {plan.run}: {n} orders, each cancelled {deadline:g} s after "
            "it is placed unless it is paid"
        )
        simulation.migrate()
        self.say(f"  database: {simulation.describe_database()} (migrated)")
        self.stop_paying = threading.Event()
        try:
            with (
                simulation.sigterm_interrupts(),
                simulation.redis_for_run() as self.redis_run,
                simulation.shop_server() as web,
            ):
                self.say(f"  redis:    {self.redis_run.description}")
                self.say(f"  web:      the shop at {web} (receives its signed payment reminders)")
                workers = simulation.start_workers(
                    opts["workers"], self.redis_run.url, log, opts["concurrency"]
                )
                try:
                    simulation.wait_until_ready(workers, log, redis_run=self.redis_run)
                    pids = ", ".join(str(w.pid) for w in workers)
                    self.say(
                        f"  worker:   {len(workers)} run_delayworker process(es) (pid {pids}), "
                        f"log {os.path.relpath(log)}"
                    )
                    finished, groups, payments = self.play(plan, workers, log)
                    self.forged = simulation.forged_reminder(web)
                finally:
                    self.stop_paying.set()
                    codes = simulation.stop_workers(workers)
        except KeyboardInterrupt:
            raise CommandError("interrupted; the worker and Redis were stopped") from None
        self.report(plan, finished, groups, payments, codes, log)

    # -- the play ----------------------------------------------------------------------------

    def play(
        self, plan: Plan, workers: list[subprocess.Popen[bytes]], log: Path
    ) -> tuple[bool, dict[str, list[int]], list[Payment]]:
        self.say(
            f"  placing {plan.orders} orders DEMO-{plan.run}-001..{plan.orders:03d} over "
            f"{plan.arrivals:g} s; paying {plan.paid_in_time} at random moments before their "
            f"deadline, {plan.at_deadline} exactly at it, {plan.unpaid} never"
        )
        start = time.monotonic()
        orders = []
        for i in range(plan.orders):
            time.sleep(max(0.0, start + i * plan.arrivals / plan.orders - time.monotonic()))
            amount = Decimal(self.rng.randrange(500, 20000)) / 100
            number = f"DEMO-{plan.run}-{i + 1:03d}"
            orders.append(Order.place(amount, number=number, cancel_in=plan.deadline))

        shuffled = [o.pk for o in self.rng.sample(orders, len(orders))]
        racing_end = plan.paid_in_time + plan.at_deadline
        groups = {
            "in_time": shuffled[: plan.paid_in_time],
            "at_deadline": shuffled[plan.paid_in_time : racing_end],
            "unpaid": shuffled[racing_end:],
        }
        due = {o.pk: o.auto_cancel_job.run_at.timestamp() for o in orders}
        payments = [
            Payment(pk, due[pk] - self.rng.uniform(0.25, 0.85) * plan.deadline)
            for pk in groups["in_time"]
        ]
        payments += [Payment(pk, due[pk]) for pk in groups["at_deadline"]]

        payer = simulation.pay_in_background(payments, self.stop_paying)
        finished = simulation.wait_for_outcomes(
            list(due), payments, workers, log, max(due.values()), self.progress,
            redis_run=self.redis_run,
        )  # fmt: skip
        payer.join(5)
        if self.tty:
            self.stdout.write("")  # end the progress line
        return finished, groups, payments

    def progress(self, progress: Progress) -> None:
        if self.tty:
            line = progress.line()
            self.width = max(self.width, len(line))
            self.stdout.write(f"\r  {line.ljust(self.width)}", ending="")
            self.stdout.flush()
        elif progress.done or progress.elapsed - self.last_line >= 1.0:  # a line a second
            self.last_line = progress.elapsed
            self.say(f"  {progress.line()}")

    # -- the report --------------------------------------------------------------------------

    def report(
        self,
        plan: Plan,
        finished: bool,
        groups: dict[str, list[int]],
        payments: list[Payment],
        codes: list[int],
        log: Path,
    ) -> None:
        results = simulation.results([pk for ids in groups.values() for pk in ids], payments)
        by_id = {r.order.pk: r for r in results}
        unpaid, in_time, racing = (
            [by_id[pk] for pk in groups[name]] for name in ("unpaid", "in_time", "at_deadline")
        )

        def count(rows: list[Result], verdict: str) -> int:
            return sum(r.verdict() == verdict for r in rows)

        wrongly = sum(r.order.cancelled_at is not None for r in in_time)
        both = sum(
            r.order.paid_at is not None and r.order.cancelled_at is not None for r in results
        )
        say = self.say
        say("")
        say(f"Report of demo {plan.run} ({plan.orders} orders, auto-cancel after "
            f"{plan.deadline:g} s)")  # fmt: skip
        say(f"  unpaid orders cancelled:             {count(unpaid, 'cancelled')}/{len(unpaid)}")
        say(f"  paid orders wrongly cancelled:       {wrongly}/{len(in_time)}"
            f"   (their auto-cancel jobs cancelled by the payment: "
            f"{count(in_time, 'paid')}/{len(in_time)})")  # fmt: skip
        won = count(racing, "paid"), count(racing, "cancelled")
        say(f"  paid exactly at the deadline:        {len(racing)}"
            f"   payment won (paid, job cancelled): {won[0]}"
            f"   cancel won (cancelled, payment refused): {won[1]}")  # fmt: skip
        say(f"  orders both paid and cancelled:      {both}")
        reminders = [r.reminder for r in results]
        sent = sum(job is not None and job.status == "succeeded" for job in reminders)
        withdrawn = sum(job is not None and job.status == "cancelled" for job in reminders)
        say(f"  payment reminders (signed callbacks): {sent} sent and verified by the shop, "
            f"{withdrawn} cancelled by the payment; unpaid orders reminded: "
            f"{sum(r.reminded for r in unpaid)}/{len(unpaid)}")  # fmt: skip
        say(f"  a reminder with a forged signature:  answered {self.forged} by the shop")
        say(f"  lateness of the cancels, job started_at - run_at:   "
            f"{self.spread([r.lateness_ms for r in results])}")  # fmt: skip
        say(f"  order cancelled_at - its deadline (run_at):         "
            f"{self.spread([r.cancelled_after_ms for r in results])}")  # fmt: skip
        say(f"  worker exit code(s):                 {', '.join(map(str, codes))}")

        problems = [] if finished else ["timed out waiting for the jobs to finish"]
        problems += [f"{r.order.number}: {r.verdict()}" for r in results
                     if r.verdict().startswith("FAULT")]  # fmt: skip
        for r in in_time:
            if r.order.cancelled_at is not None and r.payment and r.job:
                late = (r.payment.paid_at - r.job.run_at.timestamp()) * 1000
                when = (
                    f"{-late:.0f} ms before" if late < 0 else f"{late:.0f} ms after (overloaded?)"
                )
                problems.append(f"{r.order.number}: paid {when} its deadline, yet cancelled")
        problems += [f"a worker exited with code {code}" for code in codes if code != 0]
        problems += [
            f"{r.order.number}: unpaid, but not reminded" for r in unpaid if not r.reminded
        ]
        if self.forged != 401:
            problems.append(f"a forged reminder was answered {self.forged}, not 401")
        problems += [
            f"{r.order.number}: its reminder is {r.reminder.status if r.reminder else 'missing'}"
            + (f" ({r.reminder.last_error.splitlines()[-1][:200]})" if r.reminder and
               r.reminder.last_error else "")
            for r in results
            if r.reminder is None or r.reminder.status not in ("succeeded", "cancelled")
        ]  # fmt: skip
        say("")
        if problems:
            say(self.style.ERROR(f"FAILED: {len(problems)} problem(s):"))
            for problem in problems[:20]:
                say(f"  {problem}")
            say(f"  last lines of the worker log ({os.path.relpath(log)}):\n{simulation.tail(log)}")
        else:
            say(self.style.SUCCESS(
                "OK: every unpaid order was cancelled, no paid order was cancelled, every "
                "order paid at its deadline was either paid or cancelled, never both, and "
                "every unpaid order was reminded by a signed callback."
            ))  # fmt: skip
        self.where_to_look(plan.run)
        if problems:
            raise CommandError(f"the demo found {len(problems)} problem(s)")

    def where_to_look(self, run: str) -> None:
        python = os.path.relpath(sys.executable)
        if python.startswith(".."):
            python = sys.executable
        # Quoted for the shell: ready to paste from a path with spaces.
        python, manage = shlex.quote(python), shlex.quote(os.path.relpath(simulation.MANAGE))
        jobs = self.url("admin:django_delayjobs_job_changelist", "/admin/django_delayjobs/job/")
        orders = self.url("admin:shop_order_changelist", "/admin/shop/order/")
        self.say("")
        self.say("See every job and its history in the Django admin:")
        self.say(f"  {python} {manage} createsuperuser")
        self.say(f"  {python} {manage} runserver")
        self.say(f"  then open http://127.0.0.1:8000{jobs} (the jobs)")
        self.say(f"  and http://127.0.0.1:8000{orders}?q=DEMO-{run} (this run's orders)")
        self.say(
            "To place and pay orders by hand, see docs/example.md (runserver next to "
            f"`{manage} embedded_redis` and `{manage} run_delayworker`)."
        )

    @staticmethod
    def url(name: str, fallback: str) -> str:
        try:
            return reverse(name)
        except NoReverseMatch:
            return fallback

    @staticmethod
    def spread(values: list[float | None]) -> str:
        found = [v for v in values if v is not None]
        if not found:
            return "(none)"
        return (
            f"p50 {percentile(found, 50):.1f} ms, p99 {percentile(found, 99):.1f} ms, "
            f"max {max(found):.1f} ms  ({len(found)} orders)"
        )

    def say(self, text: str) -> None:
        self.stdout.write(text)
        self.stdout.flush()
