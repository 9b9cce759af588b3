"""``manage.py run_delayworker``: the promoter and the worker loop in one process."""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import logging
import os
import signal
import sys
import threading
import time
from argparse import ArgumentTypeError
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from django.core.management.base import CommandError, CommandParser
from django.db import Error as DatabaseError
from django.db import connections
from django.utils.module_loading import autodiscover_modules

from ... import sql
from ...conf import bounds, delayjobs_settings
from ...connection import get_engine
from ...databases import database_error, jobs_alias
from ...engine import DelayJobsError, validate_name
from ...logs import use_json
from ...metrics.access import loopback
from ...models import Deployment
from ...numbers import decimal_number, option, whole_number
from ...preflight import (
    check_owner,
    check_pool,
    check_redis,
    check_socket_timeout,
    describe_redis,
)
from ...worker import STOP_SIGNALS, Options, WorkerProcess
from ..output import SafeOutputCommand

if TYPE_CHECKING:
    from ...metrics.server import MetricsServer


def exit_now(code: int) -> NoReturn:
    """Exit with ``code`` at once, whatever threads still run, once the output is out."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(ValueError, OSError):  # a closed stream, a broken pipe
            stream.flush()
    os._exit(code)


#: The least time the interpreter's own exit is given (its at-exit handlers: a log or an
#: error reporter flushing), whatever ``SHUTDOWN_GRACE_SECONDS`` says (it may be 0).
EXIT_SLACK_SECONDS = 1.0


def exit_within(seconds: float, code: int) -> None:
    """Exit with ``code`` in ``seconds`` unless the interpreter's own exit is over by then.
    It waits for the tasks of every ``ThreadPoolExecutor`` and for threads that are not
    daemons: one that an action left running (a fire-and-forget send) has that long to
    end, and no longer, or it would hold up a stopped worker (or a ``--burst`` run by
    cron) for as long as it runs, for good if it never ends."""

    seconds = max(seconds, EXIT_SLACK_SECONDS)

    def watch() -> None:
        time.sleep(seconds)  # a daemon thread: it never wakes if the exit is over first
        left = [thread.name for thread in threading.enumerate()
                if thread not in (threading.main_thread(), threading.current_thread())]  # fmt: skip
        logging.getLogger("django_delayjobs.worker").warning(
            "still exiting %g s after the worker stopped, with threads running: %s (at exit "
            "Python waits for the tasks an action left to a ThreadPoolExecutor, and for "
            "threads that are not daemons); exiting without them", seconds, ", ".join(left),
        )  # fmt: skip
        exit_now(code)

    with contextlib.suppress(RuntimeError):  # "can't start new thread": the usual exit
        threading.Thread(target=watch, name="delayjobs-exit", daemon=True).start()


def check_metrics_host(opts: dict[str, Any]) -> None:
    """Refuse to serve the metrics beyond this machine without ``METRICS_TOKEN``: there are
    no sessions on the worker's port, so without a token anyone who reaches it reads them."""
    host = opts["metrics_host"]
    if opts["metrics_port"] is None or loopback(host):
        return
    if delayjobs_settings.METRICS_TOKEN is None:
        raise CommandError(
            f"--metrics-host {host!r} is not a loopback address, and without "
            "DELAYJOBS['METRICS_TOKEN'] anyone who reaches it would read the metrics: set "
            "METRICS_TOKEN, or keep the default 127.0.0.1"
        )


class StoppedDuringStartUp(Exception):
    """A SIGTERM/SIGINT/SIGHUP came before the worker started: exit 0."""


MAX_CONCURRENCY = 1000
#: ``--metrics-host``'s default. Another host without ``--metrics-port`` is refused (no port
#: is opened: it would be ignored); this one is the same whether given or not.
DEFAULT_METRICS_HOST = "127.0.0.1"
LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.INFO, 3: logging.DEBUG}


def queue_list(value: str) -> list[str]:
    """The queues of ``--queues``; an ``ArgumentTypeError`` says why not (argparse words
    a ``ValueError`` as "invalid queue_list value", without its reason)."""
    queues = [q.strip() for q in value.split(",") if q.strip()]
    if not queues:
        raise ArgumentTypeError(f"no queue given in {value!r}")
    for queue in queues:
        try:
            validate_name(queue, "queue name")
        except ValueError as exc:
            raise ArgumentTypeError(str(exc)) from exc
    return list(dict.fromkeys(queues))  # "a,a": served once, in the order first given


class Command(SafeOutputCommand):
    help = "Run the delayjobs promoter and worker threads until SIGTERM/SIGINT/SIGHUP."
    process: WorkerProcess | None = None  # once built: signals go to it
    exits = False  # run from the command line: the process exits when the worker stops

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queues", type=queue_list, default=None,
            help="Comma-separated queues in strict priority order (default: DEFAULT_QUEUE).",
        )  # fmt: skip
        parser.add_argument(
            "--concurrency", type=option(whole_number), default=1, help="Worker threads."
        )
        roles = parser.add_mutually_exclusive_group()
        roles.add_argument("--promoter-only", action="store_true", help="Only promote.")
        roles.add_argument("--worker-only", action="store_true", help="Only run jobs.")
        parser.add_argument("--burst", action="store_true",
                            help="Run everything due now, then exit 0.")  # fmt: skip
        parser.add_argument(
            "--tick",
            type=option(decimal_number),
            default=None,
            help="Longest promoter sleep in seconds (default: TICK_SECONDS).",
        )
        parser.add_argument(
            "--log-format", choices=("text", "json"), default="text",
            help="json: one JSON object per line (django_delayjobs.logs.JsonFormatter) on "
                 "the django_delayjobs loggers' handlers.",
        )  # fmt: skip
        parser.add_argument(
            "--metrics-port", type=option(whole_number), default=None,
            help="Serve the deployment's Prometheus metrics on this port (0: any free "
                 "port); needs the metrics extra.",
        )  # fmt: skip
        parser.add_argument(
            "--metrics-host", default=DEFAULT_METRICS_HOST,
            help="Address the metrics port listens on (default 127.0.0.1; 0.0.0.0 for all, "
                 "which needs METRICS_TOKEN: any non-loopback address does).",
        )  # fmt: skip

    def run_from_argv(self, argv: list[str]) -> None:
        """As Django's, but a worker that left actions running past the shutdown grace
        exits then, with the code it would have: at the interpreter's exit Python joins the
        threads an action started through a ``ThreadPoolExecutor`` (and non-daemon ones),
        so the process would run on, its heartbeat removed and the action's lease no longer
        extended, until another worker ran the same job again beside it."""
        self.process = None
        self.exits = True
        code = 1
        try:
            super().run_from_argv(argv)
            code = 0
        except SystemExit as exc:  # a CommandError, printed by Django
            code = exc.code if isinstance(exc.code, int) else 1
            raise
        finally:
            if self.process is not None and self.process.abandoned:
                exit_now(code)
            elif self.process is not None:
                exit_within(delayjobs_settings.SHUTDOWN_GRACE_SECONDS, code)

    def check(self, *args: Any, **kwargs: Any) -> Any:
        """Django's system checks, on the database the jobs live on. Django 6.1 opens every
        database it checks (on SQLite it asks whether it has JSON), every alias by default:
        one the jobs do not use, down or gone, must not keep the worker from running them
        (an action that uses it fails and is retried). An error: one line, not a
        traceback."""
        if kwargs.get("databases") is None:
            kwargs["databases"] = [sql.db()]
        try:
            return super().check(*args, **kwargs)
        except DatabaseError as exc:
            alias = sql.db() if kwargs["databases"] == [sql.db()] else None
            raise CommandError(database_error(exc, alias)) from exc

    def handle(self, *args: Any, **opts: Any) -> None:
        alias = jobs_alias()
        # Django never resets the flag in autocommit: set before this call (a caller's
        # error, caught, in-process), it says nothing of an error met below.
        erred = alias is not None and connections[alias].errors_occurred
        # A stop during the start-up checks (a rolling update, Ctrl-C while Redis is slow
        # to answer) ends the process by its own exit, never by the signal.
        self.signalled = False
        self.process = None
        previous = self.install_signal_handlers()
        try:
            self.check_options(opts)
            self.run(opts)
        except StoppedDuringStartUp:
            return
        except DelayJobsError as exc:  # bad settings, Redis refused, a thread died
            raise CommandError(str(exc)) from exc
        except DatabaseError as exc:  # a tasks module's query, say: on any database
            failed = alias is not None and connections[alias].errors_occurred and not erred
            raise CommandError(database_error(exc, alias if failed else None)) from exc
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def install_signal_handlers(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        handlers = {**dict.fromkeys(STOP_SIGNALS, self.on_signal), signal.SIGQUIT: self.on_quit}
        return {signum: signal.signal(signum, handler) for signum, handler in handlers.items()}

    def on_quit(self, signum: int, frame: FrameType | None) -> None:
        """SIGQUIT: the process's, once it exists; before, exit at once (it has no
        heartbeat yet), with every thread's traceback as it would."""
        if self.process is not None:
            self.process.on_quit(signum, frame)
            return
        with contextlib.suppress(RuntimeError, ValueError, OSError):  # no usable stderr
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        os._exit(1)

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        """Until the worker process exists, note the signal (checked after each start-up
        step); then it is the process's (the handler it installs itself, from then on)."""
        if self.process is not None:
            self.process.on_signal(signum, frame)
            return
        if self.signalled:
            os._exit(1)  # a second signal: at once, as once running
        self.signalled = True

    def started(self, step: str) -> None:
        """After a start-up step: stop here (exit 0) if a signal came meanwhile."""
        if self.signalled:
            logging.getLogger("django_delayjobs.worker").warning(
                "signal received during start-up (%s): exiting", step
            )
            raise StoppedDuringStartUp

    def check_options(self, opts: dict[str, Any]) -> None:
        """Refuse a bad option value with exit code 2, as argparse refuses a bad spelling."""
        if not 1 <= opts["concurrency"] <= MAX_CONCURRENCY:
            raise CommandError(f"--concurrency must be from 1 to {MAX_CONCURRENCY}", returncode=2)
        low, high = bounds("TICK_SECONDS")
        if opts["tick"] is not None and not low <= opts["tick"] <= high:
            raise CommandError(f"--tick must be from {low} to {high} seconds", returncode=2)
        port = opts["metrics_port"]
        if port is not None and not 0 <= port <= 65535:
            raise CommandError("--metrics-port must be from 0 to 65535", returncode=2)
        if port is None and opts["metrics_host"] != DEFAULT_METRICS_HOST:
            raise CommandError("--metrics-host needs --metrics-port: without it no metrics "
                               "port is opened", returncode=2)  # fmt: skip
        if opts["burst"] and opts["promoter_only"]:
            raise CommandError("--burst runs the jobs that are due: it needs the worker role, "
                               "not --promoter-only", returncode=2)  # fmt: skip

    def run(self, opts: dict[str, Any]) -> None:
        check_metrics_host(opts)  # here: reading the settings may raise DelayJobsError
        verbosity = opts["verbosity"]
        self.configure_logging(verbosity, opts["log_format"])
        self.started("settings")
        autodiscover_modules("tasks")  # the @delayable functions of installed apps
        self.started("loading tasks")
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
        check_socket_timeout(engine)
        try:
            warnings = check_redis(engine)
        except DelayJobsError as exc:
            raise CommandError(f"cannot use Redis at {describe_redis(engine)}: {exc}") from exc
        self.started("checking Redis")
        try:  # the first query, on the jobs' database: an error here is its
            check_owner(engine)
        except DatabaseError as exc:
            raise CommandError(database_error(exc, jobs_alias(Deployment))) from exc
        self.started("checking the database")
        for warning in warnings:
            self.stderr.write(self.style.WARNING(f"WARNING: {warning}"))
        process = WorkerProcess(engine, options)
        check_pool(engine, process.redis_threads() + (opts["metrics_port"] is not None))
        if verbosity:
            roles = [r for r in ("promoter", "worker") if getattr(options, r)]
            self.stdout.write(
                f"delayjobs {process.id}: redis {describe_redis(engine)}, "
                f"queues {','.join(options.queues)}, roles {'+'.join(roles)}, "
                f"concurrency {options.concurrency}{', burst' if options.burst else ''}"
            )
            self.stdout.flush()
        server = self.start_metrics(opts)
        if self.exits:
            # What is loaded by now (Django, the apps, the tasks) lives as long as the
            # process: out of the collector's reach, a full collection no longer walks its
            # 70,000 objects, a pause of 13-19 ms in the middle of a due job
            # (docs/performance.md). Garbage is collected first, not frozen with it. Not
            # in-process (call_command): the caller's objects are not ours to freeze (a
            # frozen cycle holding a closed SQLite connection's statement kept it open),
            # and a collection of a large caller's heap cost each call 0.2 s.
            gc.collect()
            gc.freeze()
        try:
            self.process = process  # from here on a signal stops the process itself
            self.started("starting")  # after: a signal in between is seen by one of them
            process.run(also=[server.thread] if server is not None else [])
        finally:
            if server is not None:
                server.close()
        if process.abandoned and not self.exits:
            if running := process.left_running:
                busy = (
                    f"actions still ran (job(s) {', '.join(running)}) when the shutdown "
                    "grace ended: called in-process, the worker leaves them running"
                )
            else:  # what it was waiting for was handed back
                busy = ("worker threads were still busy outside any action (a claim waiting "
                        "on the database, say) when the shutdown grace ended: called "
                        "in-process, the worker leaves them waiting, and a claim that lands "
                        "runs its action")  # fmt: skip
            raise CommandError(
                f"{busy} in this process with no lease extended, so another worker may run "
                "the same jobs beside them"
            )
        if verbosity:
            self.stdout.write(f"delayjobs {process.id}: stopped ({process.stats.line()})")

    def start_metrics(self, opts: dict[str, Any]) -> MetricsServer | None:
        if opts["metrics_port"] is None:
            return None
        from ...metrics.server import MetricsServer

        host, port = opts["metrics_host"], opts["metrics_port"]
        try:
            server = MetricsServer(host, port).start()
        except ImportError as exc:
            raise CommandError("--metrics-port needs prometheus_client, the extra "
                               "django-delayjobs[metrics]: pip install prometheus-client"
                               ) from exc  # fmt: skip
        except (OSError, TypeError) as exc:  # TypeError: a host the socket cannot encode
            raise CommandError(f"--metrics-port: cannot listen on {host}:{port}: {exc}") from exc
        if opts["verbosity"]:
            self.stdout.write(f"delayjobs metrics: {server.url}")
            self.stdout.flush()
        return server

    def configure_logging(self, verbosity: int, log_format: str = "text") -> None:
        logger = logging.getLogger("django_delayjobs")
        logger.setLevel(LEVELS.get(verbosity, logging.DEBUG))
        if log_format == "json":
            use_json(logger)
            return
        if not logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
            )
            logger.addHandler(handler)
