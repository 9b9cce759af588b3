"""``manage.py run_delayworker``: the promoter and the worker loop in one process."""

from __future__ import annotations

import logging
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.module_loading import autodiscover_modules

from ...conf import delayjobs_settings
from ...connection import get_engine
from ...engine import DelayJobsError, validate_name
from ...preflight import check_redis, describe_redis
from ...worker import Options, WorkerProcess

LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.INFO, 3: logging.DEBUG}


def queue_list(value: str) -> list[str]:
    queues = [q.strip() for q in value.split(",") if q.strip()]
    if not queues:
        raise ValueError("no queue given")
    for queue in queues:
        validate_name(queue, "queue name")
    return queues


class Command(BaseCommand):
    help = "Run the delayjobs promoter and worker threads until SIGTERM/SIGINT."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queues", type=queue_list, default=None,
            help="Comma-separated queues in strict priority order (default: DEFAULT_QUEUE).",
        )  # fmt: skip
        parser.add_argument("--concurrency", type=int, default=1, help="Worker threads.")
        roles = parser.add_mutually_exclusive_group()
        roles.add_argument("--promoter-only", action="store_true", help="Only promote.")
        roles.add_argument("--worker-only", action="store_true", help="Only run jobs.")
        parser.add_argument("--burst", action="store_true",
                            help="Run everything due now, then exit 0.")  # fmt: skip
        parser.add_argument(
            "--tick",
            type=float,
            default=None,
            help="Longest promoter sleep in seconds (default: TICK_SECONDS).",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1")
        if opts["tick"] is not None and not 0 < opts["tick"] <= 60:
            raise CommandError("--tick must be between 0 and 60 seconds")
        verbosity = opts["verbosity"]
        self.configure_logging(verbosity)
        autodiscover_modules("tasks")  # the @delayable functions of installed apps
        options = Options(
            queues=opts["queues"] or [delayjobs_settings.DEFAULT_QUEUE],
            concurrency=opts["concurrency"],
            promoter=not opts["worker_only"],
            worker=not opts["promoter_only"],
            burst=opts["burst"],
            tick=opts["tick"],
            status_every=delayjobs_settings.HEARTBEAT_SECONDS if verbosity >= 2 else 0.0,
        )
        engine = get_engine()
        try:
            warnings = check_redis(engine)
        except DelayJobsError as exc:
            raise CommandError(f"cannot use Redis at {describe_redis(engine)}: {exc}") from exc
        for warning in warnings:
            self.stderr.write(self.style.WARNING(f"WARNING: {warning}"))
        process = WorkerProcess(engine, options)
        if verbosity:
            roles = [r for r in ("promoter", "worker") if getattr(options, r)]
            self.stdout.write(
                f"delayjobs {process.id}: redis {describe_redis(engine)}, "
                f"queues {','.join(options.queues)}, roles {'+'.join(roles)}, "
                f"concurrency {options.concurrency}{', burst' if options.burst else ''}"
            )
            self.stdout.flush()
        process.run()
        if verbosity:
            self.stdout.write(f"delayjobs {process.id}: stopped ({process.stats.line()})")

    def configure_logging(self, verbosity: int) -> None:
        logger = logging.getLogger("django_delayjobs")
        logger.setLevel(LEVELS.get(verbosity, logging.DEBUG))
        if not logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
            )
            logger.addHandler(handler)
