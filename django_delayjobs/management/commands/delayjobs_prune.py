"""``manage.py delayjobs_prune``: delete old finished jobs and their history, in batches."""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import Error as DatabaseError
from django.utils import timezone

from ...databases import database_error, jobs_alias
from ...numbers import option, whole_number
from ...retention import (
    DEFAULT_BATCH,
    DEFAULT_RATE,
    DEFAULT_STATUSES,
    MAX_BATCH,
    MAX_RATE,
    Pruned,
    check_batch,
    check_rate,
    count,
    parse_duration,
    parse_statuses,
    prune,
)
from ...worker import STOP_SIGNALS
from ..output import SafeOutputCommand

#: Seconds between two progress lines (at the default verbosity).
PROGRESS_EVERY = 5.0


class Command(SafeOutputCommand):
    help = (
        "Delete finished jobs (and their history) that finished longer ago than "
        "--older-than; dead jobs only when --status names them."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than", required=True, metavar="AGE",
            help="Age of the finish time: 30d, 12h, 90m or 3600s.",
        )  # fmt: skip
        parser.add_argument(
            "--status", default=",".join(DEFAULT_STATUSES), metavar="LIST",
            help=f"Comma-separated finished statuses (default {','.join(DEFAULT_STATUSES)}; "
                 "add dead to prune dead jobs too).",
        )  # fmt: skip
        parser.add_argument(
            "--batch", type=option(whole_number), default=DEFAULT_BATCH,
            help=f"Jobs per transaction, 1 to {MAX_BATCH} (default {DEFAULT_BATCH}).",
        )  # fmt: skip
        parser.add_argument(
            "--max-rate", type=option(whole_number), default=DEFAULT_RATE, metavar="JOBS",
            help=f"At most this many jobs per second, up to {MAX_RATE} (default "
                 f"{DEFAULT_RATE}; 0: as fast as the database deletes them, for a quiet hour).",
        )  # fmt: skip
        parser.add_argument("--dry-run", action="store_true", help="Count only; delete nothing.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            age, statuses, batch, max_rate = self.checked(options)
        except ValueError as exc:  # a bad option: exit 2, as argparse's own refusals
            raise CommandError(str(exc), returncode=2) from exc
        self.verbosity = options["verbosity"]
        self.last_progress: float | None = None
        self.so_far = Pruned()  # the running totals, which a database error does not return
        self.signalled: int | None = None
        cutoff = timezone.now() - age
        what = f"{','.join(statuses)} jobs finished before {cutoff:%Y-%m-%d %H:%M:%S} UTC"
        try:
            if options["dry_run"]:
                found = count(cutoff, statuses)
                self.stdout.write(
                    f"dry run: would delete {found.jobs} {what}, with {found.events} event(s)"
                )
                return
            with self.stop_on_signal() as stop:
                total = prune(cutoff, statuses, batch=batch, max_rate=max_rate,
                              progress=self.progress, stop=stop)  # fmt: skip
        except DatabaseError as exc:  # the batches deleted before it, then why
            if self.so_far.batches:
                self.stdout.write(f"{deleted(self.so_far, what)} before the database failed")
            raise CommandError(database_error(exc, jobs_alias())) from exc
        done = deleted(total, what)
        if self.signalled is not None and not total.complete:
            name = signal.Signals(self.signalled).name
            raise CommandError(f"stopped by {name}: {done}; run it again to go on",
                               returncode=128 + self.signalled)  # fmt: skip
        self.stdout.write(done + (f" (at most {max_rate} jobs/s)" if max_rate else ""))
        if total.protected:
            self.stdout.write(f"left {total.protected} job(s) that another table refers to")

    @contextlib.contextmanager
    def stop_on_signal(self) -> Iterator[threading.Event]:
        """An event set by SIGTERM/SIGINT/SIGHUP while the prune runs: it then ends with
        the batch under way (a second signal ends the process at once). Left to its
        default, SIGTERM could land between a batch's commit and the purge of its dead ids
        from the Redis garbage."""
        self.signalled = None
        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            if stop.is_set():
                os._exit(128 + signum)
            self.signalled = signum
            stop.set()

        previous = {}
        if threading.current_thread() is threading.main_thread():
            previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
        try:
            yield stop
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    @staticmethod
    def checked(options: dict[str, Any]) -> tuple[datetime.timedelta, tuple[str, ...], int,
                                                   int | None]:  # fmt: skip
        """The options' values, or ValueError (needs neither the database nor Redis)."""
        return (
            parse_duration(options["older_than"]),
            parse_statuses(options["status"]),
            check_batch(options["batch"]),
            check_rate(options["max_rate"]),
        )

    def progress(self, total: Pruned) -> None:
        """A line for the first batch and then every PROGRESS_EVERY seconds (every batch
        with ``-v 2``)."""
        self.so_far = total
        if self.verbosity < 1:
            return
        clock = time.monotonic()
        if (self.verbosity < 2 and self.last_progress is not None
                and clock - self.last_progress < PROGRESS_EVERY):  # fmt: skip
            return
        self.last_progress = clock
        now = datetime.datetime.now(datetime.UTC)
        self.stdout.write(
            f"{now:%H:%M:%S} batch {total.batches}: {total.jobs} job(s), "
            f"{total.events} event(s) deleted so far"
        )
        self.stdout.flush()


def deleted(total: Pruned, what: str) -> str:
    return (f"deleted {total.jobs} {what}, with {total.events} event(s), "
            f"in {total.batches} batch(es)")  # fmt: skip
