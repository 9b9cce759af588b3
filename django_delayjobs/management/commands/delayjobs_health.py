"""``manage.py delayjobs_health``: one line per check; exit 0 when all pass, 1 if not.

Bad options (one given twice too), and settings that cannot work (past the system
checks), exit 2. The checks are those of ``django_delayjobs.health`` (and of the
``health/`` view).
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import CommandError, CommandParser

from ... import health
from ...conf import delayjobs_settings
from ...exceptions import DelayJobsError
from ..output import SafeOutputCommand


class Counted(argparse.Action):
    """``store``, and the option's name noted in ``GIVEN`` each time it is given: argparse
    keeps the last value, so ``--queues a --queues b`` checked b alone (a probe so written
    said healthy with a left unchecked); ``limits`` refuses it, as the view refuses
    ``?queues=a&queues=b``."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, GIVEN, [*getattr(namespace, GIVEN, []), self.option_strings[0]])


#: The options the command line gave, once per time given (see ``Counted``).
GIVEN = "delayjobs_given"


class Command(SafeOutputCommand):
    help = (
        "Check Redis, the database, live workers, overdue jobs (and dead jobs with "
        "--max-garbage) of each queue; exit 1 if any check fails."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queues", default=None, metavar="LIST", action=Counted,
            help="Comma-separated queues to check (default: DEFAULT_QUEUE).",
        )  # fmt: skip
        parser.add_argument(
            "--max-overdue", default=str(health.DEFAULT_MAX_OVERDUE), metavar="SECONDS",
            action=Counted,
            help="Longest a due job may wait for a worker (default "
                 f"{health.DEFAULT_MAX_OVERDUE:g}).",
        )  # fmt: skip
        parser.add_argument("--min-workers", default="1", metavar="N", action=Counted,
                            help="Live worker processes wanted per queue (default 1; "
                                 "0: the check always passes).")  # fmt: skip
        parser.add_argument(
            "--max-garbage", default=None, metavar="N", action=Counted,
            help="Most dead jobs a queue may hold (default: not checked).",
        )  # fmt: skip
        parser.add_argument(
            "--timeout", default=str(health.DEFAULT_TIMEOUT), metavar="SECONDS", action=Counted,
            help="Longest the whole check may take; the checks not made by then fail "
                 f"(default {health.DEFAULT_TIMEOUT:g}, from {health.MIN_TIMEOUT:g} to "
                 f"{health.MAX_TIMEOUT:g}).",
        )  # fmt: skip

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            limits = self.limits(options)  # reads DEFAULT_QUEUE
            checks = health.run_from_settings(limits)
        except (ValueError, DelayJobsError) as exc:  # a bad option, or bad settings
            raise CommandError(str(exc), returncode=2) from exc
        width = max(len(c.name) for c in checks)
        for check in checks:
            mark = "ok  " if check.ok else "FAIL"
            line = f"{mark} {check.name.ljust(width)}  {check.detail}"
            style = self.style.SUCCESS if check.ok else self.style.ERROR
            self.stdout.write(style(line))
        failed = [c.name for c in checks if not c.ok]
        if failed:
            raise CommandError(f"{len(failed)} check(s) failed: {', '.join(failed)}")

    @staticmethod
    def limits(options: dict[str, Any]) -> health.Limits:
        def named(option: str, parse: Any, *args: Any) -> Any:
            try:
                return parse(options[option.replace("-", "_")], *args)
            except ValueError as exc:
                raise ValueError(f"--{option}: {exc}") from exc

        given = options.get(GIVEN) or []
        for option in dict.fromkeys(given):
            if given.count(option) > 1:
                raise ValueError(f"{option} given {given.count(option)} times: give it once")
        queues = options["queues"]
        return health.Limits(
            queues=named("queues", health.parse_queues)
            if queues is not None
            else (delayjobs_settings.DEFAULT_QUEUE,),
            max_overdue=named("max-overdue", health.parse_seconds),
            min_workers=named("min-workers", health.parse_count, health.MAX_WORKERS),
            max_garbage=None
            if options["max_garbage"] is None
            else named("max-garbage", health.parse_count, health.MAX_GARBAGE),
            timeout=named("timeout", health.parse_seconds, health.MIN_TIMEOUT, health.MAX_TIMEOUT),
        )
