"""What the ``demo`` and ``race`` commands share: a Redis, worker processes, timed payments
and the verdict on each order.

Everything is real: a real ``redis-server``, ``run_delayworker`` processes started with
this project's settings, payments made by threads at chosen wall-clock moments.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import redis
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.db.models import Count
from django.test.utils import override_settings

from django_delayjobs.conf import delayjobs_settings
from django_delayjobs.connection import get_engine
from django_delayjobs.embedded import EmbeddedRedis, die_with_owner
from django_delayjobs.models import Job
from django_delayjobs.models import Status as JobStatus
from django_delayjobs.redact import without_userinfo

from .models import Order, PaymentRefused

MANAGE = Path(settings.BASE_DIR) / "manage.py"

#: The longest delay ``demo`` and ``race`` take: they wait for every deadline to pass.
MAX_SECONDS = 86400.0


def seconds(text: str) -> float:
    """An argparse type: a number of seconds from 0 to a day (not NaN, not infinite)."""
    value = float(text)
    if not 0 <= value <= MAX_SECONDS:  # False for NaN too
        raise ValueError(text)
    return value


def deadline_seconds(text: str) -> float:
    """An argparse type: ``seconds``, at least 1. An order's reminder is due halfway to its
    deadline and expires at it: under a second, a worker's ordinary lateness (a callback
    takes milliseconds) lets reminders expire, and the demo fails its own check."""
    value = seconds(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (seconds), not {text}")
    return value


def redis_answers(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Inside the block SIGTERM raises ``KeyboardInterrupt``, as Ctrl-C does, so that the
    ``finally`` clauses stop the workers and Redis (by default SIGTERM ends the process on
    the spot and leaves the redis-server running)."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass
class RunRedis:
    """The Redis of a run: ``REDIS_URL``'s, or a private redis-server (``server``)."""

    url: str
    description: str
    server: EmbeddedRedis | None = None

    def check(self) -> None:
        """Raise ``CommandError`` if the private redis-server has exited: the workers would
        wait for it, and the run for them, until its time-out, showing progress that
        cannot come."""
        if self.server is None:
            return
        process = self.server.process
        if process is None or process.poll() is not None:
            code = None if process is None else process.returncode
            log = tail(self.server.directory / "redis.log")
            raise CommandError(f"the private redis-server exited (code {code}):\n{log}")


@contextlib.contextmanager
def redis_for_run() -> Iterator[RunRedis]:
    """``REDIS_URL``'s Redis, or a private server stopped (by pid) at exit."""
    url = os.environ.get("REDIS_URL")
    if url:
        yield RunRedis(url, f"REDIS_URL {without_userinfo(url)}")  # no password shown
        return
    server = EmbeddedRedis()  # a fresh temporary directory: never clashes with anything
    try:
        try:
            url = server.start()
        except (OSError, RuntimeError) as exc:  # no redis-server to run, or it did not start
            raise CommandError(str(exc)) from exc
        with override_settings(DELAYJOBS={**settings.DELAYJOBS, "REDIS_URL": url}):
            yield RunRedis(
                url, f"a private redis-server (pid {server.pid}, stopped at exit)", server
            )
    finally:
        server.close()


def migrate() -> None:
    """``migrate``, one process at a time: two demos started together on a new database
    would both create the tables, and the second fail ("table ... already exists")."""
    if connection.vendor == "sqlite":  # the lock sits next to the database it guards
        lock_path = Path(f"{connection.settings_dict['NAME']}.migrate-lock")
    else:
        lock_path = Path(settings.VAR_DIR) / "migrate.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as lock:
        if sys.platform != "win32":  # no fcntl there
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        call_command("migrate", interactive=False, verbosity=0)


def describe_database() -> str:
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"SQLite {os.path.relpath(db['NAME'])}"
    return f"{connection.vendor} {db.get('HOST') or 'localhost'}/{db['NAME']}"


@contextlib.contextmanager
def shop_server() -> Iterator[str]:
    """Serve this project on 127.0.0.1 (a free port) from a thread, for the payment
    reminders the shop sends itself; yield its base URL.

    Inside the block the ``shop`` destination points at it, here and (through
    ``SHOP_BASE_URL``) in the workers started then.
    """
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from django.core.wsgi import get_wsgi_application
    from shopsite.settings import shop_delayjobs

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    class Handler(WSGIRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass  # the report says what happened

    httpd = make_server("127.0.0.1", 0, get_wsgi_application(), Server, Handler)
    base_url = f"http://127.0.0.1:{httpd.server_port}"
    thread = threading.Thread(target=httpd.serve_forever, name="shop-http", daemon=True)
    thread.start()
    before = os.environ.get("SHOP_BASE_URL")
    os.environ["SHOP_BASE_URL"] = base_url  # for the worker processes
    http = {k: v for k, v in shop_delayjobs(base_url).items() if k.startswith("HTTP_")}
    try:
        with override_settings(DELAYJOBS={**settings.DELAYJOBS, **http}):
            yield base_url
    finally:
        httpd.shutdown()
        httpd.server_close()
        if before is None:
            os.environ.pop("SHOP_BASE_URL", None)
        else:
            os.environ["SHOP_BASE_URL"] = before


def forged_reminder(base_url: str) -> int:
    """POST a reminder signed with a wrong secret to the shop; return the HTTP status."""
    import urllib.error
    import urllib.request

    from django_delayjobs.callbacks.signing import new_secret, sign

    body = b'{"order": "DEMO-FORGED"}'
    headers = {"Content-Type": "application/json", **sign("forged-1", body, [new_secret()])}
    request = urllib.request.Request(f"{base_url}/hooks/payment-reminder/", body, headers)
    # The shop runs in this process: its "Unauthorized" warning for this request is the
    # expected answer, and the report says it; it would read like a failure of the demo.
    quiet = logging.getLogger("django.request")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    finally:
        quiet.setLevel(level)


# -- worker processes ------------------------------------------------------------------


def start_workers(
    count: int, redis_url: str, log: Path, concurrency: int
) -> list[subprocess.Popen[bytes]]:
    """Start ``count`` ``run_delayworker`` processes with this project's settings."""
    env = {**os.environ, "REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1"}
    if connection.vendor == "sqlite":
        env["SHOP_SQLITE_PATH"] = str(connection.settings_dict["NAME"])
    cmd = [
        sys.executable,
        str(MANAGE),
        "run_delayworker",
        "-v",
        "1",
        "--concurrency",
        str(concurrency),
    ]
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        out = open(log, "wb")  # noqa: SIM115 - closed below: each child keeps its own copy
    except OSError as exc:  # --worker-log names a directory, or a place that is not ours
        raise CommandError(f"cannot write the workers' log: {exc}") from exc
    preexec = die_with_owner()  # Linux: SIGTERM if the demo dies without stopping it
    workers = []
    with out:
        for _ in range(count):
            workers.append(
                subprocess.Popen(
                    cmd,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    preexec_fn=preexec,
                )
            )
    return workers


def wait_until_ready(
    workers: Sequence[subprocess.Popen[bytes]],
    log: Path,
    timeout: float = 60,
    redis_run: RunRedis | None = None,
) -> None:
    """Wait until every worker has sent its first heartbeat to Redis."""
    engine = get_engine()
    queue = delayjobs_settings.DEFAULT_QUEUE
    deadline = time.monotonic() + timeout
    wanted = {w.pid for w in workers}
    while True:
        if redis_run is not None:
            redis_run.check()
        for worker in workers:
            if worker.poll() is not None:
                raise CommandError(f"the worker exited with code {worker.returncode}:\n{tail(log)}")
        if wanted <= {w.get("pid") for w in engine.workers(queue)}:
            return
        if time.monotonic() > deadline:
            raise CommandError(f"the worker did not start within {timeout} s:\n{tail(log)}")
        time.sleep(0.05)


def stop_workers(workers: Sequence[subprocess.Popen[bytes]], timeout: float = 30) -> list[int]:
    """SIGTERM every worker (by pid) and return their exit codes."""
    for worker in workers:
        if worker.poll() is None:
            worker.terminate()
    codes = []
    for worker in workers:
        try:
            codes.append(worker.wait(timeout))
        except subprocess.TimeoutExpired:
            worker.kill()
            codes.append(worker.wait())
    return codes


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# -- payments ------------------------------------------------------------------------------


@dataclass
class Payment:
    order_id: int
    at: float  # when to pay, seconds since the epoch
    outcome: str = ""  # "paid", "refused" or "error"
    detail: str = ""
    paid_at: float = 0.0  # when pay() was called


def _pay(payment: Payment, stop: threading.Event) -> None:
    try:
        connection.ensure_connection()  # connect before the moment, not at it
        if stop.wait(max(0.0, payment.at - time.time())):
            return  # the run was interrupted: no more payments
        payment.paid_at = time.time()
        Order(pk=payment.order_id).pay()
        payment.outcome = "paid"
    except PaymentRefused as exc:
        payment.outcome, payment.detail = "refused", str(exc)
    except Exception as exc:  # anything else is a bug the report shows
        payment.outcome, payment.detail = "error", f"{type(exc).__name__}: {exc}"
    finally:
        connection.close()


def pay_in_background(
    payments: Sequence[Payment], stop: threading.Event, threads: int = 16
) -> threading.Thread:
    """Pay each order at its moment, from a pool of threads, until ``stop`` is set (the
    payments not made by then are dropped: the pool's threads would otherwise keep the
    process alive until the last one); return the running thread."""
    ordered = sorted(payments, key=lambda p: p.at)

    def run() -> None:
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pay") as pool:
            list(pool.map(lambda payment: _pay(payment, stop), ordered))

    thread = threading.Thread(target=run, name="payments", daemon=True)
    thread.start()
    return thread


# -- what happened ------------------------------------------------------------------------


@dataclass
class Result:
    order: Order
    job: Job | None
    payment: Payment | None
    reminder: Job | None = None

    @property
    def reminded(self) -> bool:
        """The reminder callback reached the shop, which found the order unpaid."""
        job = self.reminder
        if job is None or job.status != JobStatus.SUCCEEDED or not job.result:
            return False
        try:
            return bool(json.loads(job.result.get("body") or "{}").get("reminded"))
        except (ValueError, AttributeError):
            return False

    @property
    def lateness_ms(self) -> float | None:
        """How late the cancel job started (started_at - run_at), if it ran."""
        job = self.job
        if job is None or job.started_at is None:
            return None
        return (job.started_at - job.run_at).total_seconds() * 1000

    @property
    def cancelled_after_ms(self) -> float | None:
        """How long after its deadline the order was cancelled, if it was."""
        if self.job is None or self.order.cancelled_at is None:
            return None
        return (self.order.cancelled_at - self.job.run_at).total_seconds() * 1000

    def verdict(self) -> str:
        """``paid``: paid, its job cancelled; ``cancelled``: cancelled by its job; else a fault."""
        order, job, payment = self.order, self.job, self.payment
        if order.paid_at is not None and order.cancelled_at is not None:
            return "FAULT: paid and cancelled"
        if payment is not None and payment.outcome == "error":
            return f"FAULT: the payment failed: {payment.detail}"
        if job is None:
            return "FAULT: no auto-cancel job"
        if order.status == Order.Status.PAID:
            if payment is None or payment.outcome != "paid":
                return "FAULT: paid, but not by this run"
            if job.status != JobStatus.CANCELLED:
                return f"FAULT: paid, but its job is {job.status} ({job.result!r})"
            if not any(
                e.kind == "cancelled" and e.actor == "signal:order_paid" for e in job.events.all()
            ):
                return "FAULT: paid, but its job was not cancelled by the order_paid signal"
            return "paid"
        if order.status == Order.Status.CANCELLED:
            if job.status != JobStatus.SUCCEEDED or job.result != "cancelled":
                return f"FAULT: cancelled, but its job is {job.status} ({job.result!r})"
            if payment is not None and payment.outcome != "refused":
                return f"FAULT: cancelled, yet the payment says {payment.outcome}"
            return "cancelled"
        return f"FAULT: still {order.status} (job {job.status})"


def jobs_of(orders: Sequence[Order], reminders: bool = False) -> dict[int, Job]:
    """The auto-cancel (or reminder) job of each order, by order id."""
    keys = {(o.reminder_key if reminders else o.auto_cancel_key): o.pk for o in orders}
    jobs = Job.objects.filter(key__in=list(keys)).prefetch_related("events")
    return {keys[job.key]: job for job in jobs}


def results(order_ids: Sequence[int], payments: Sequence[Payment]) -> list[Result]:
    orders = list(Order.objects.filter(pk__in=order_ids).order_by("pk"))
    jobs, reminders = jobs_of(orders), jobs_of(orders, reminders=True)
    paying = {p.order_id: p for p in payments}
    return [Result(o, jobs.get(o.pk), paying.get(o.pk), reminders.get(o.pk)) for o in orders]


def unfinished(order_ids: Sequence[int]) -> int:
    """How many of these orders' jobs (auto-cancels and reminders) have not finished."""
    orders = list(Order.objects.filter(pk__in=order_ids).only("pk"))
    keys = [key for order in orders for key in (order.auto_cancel_key, order.reminder_key)]
    return (
        Job.objects.filter(key__in=keys)
        .exclude(
            status__in=[JobStatus.SUCCEEDED, JobStatus.CANCELLED, JobStatus.DEAD, JobStatus.SKIPPED]
        )
        .count()
    )


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(len * q / 100), at least 1
    return ordered[int(rank) - 1]


@dataclass
class Progress:
    elapsed: float
    pending: int
    paid: int
    cancelled: int
    jobs_left: int
    payments_done: int
    payments: int
    deadlines_in: float  # seconds until the last deadline (0 once past)

    @property
    def done(self) -> bool:
        return self.jobs_left == 0 and self.payments_done == self.payments

    def line(self) -> str:
        when = (
            f"last deadline in {self.deadlines_in:4.1f} s"
            if self.deadlines_in > 0
            else ("all deadlines passed")
        )
        return (
            f"{self.elapsed:5.1f} s  orders: {self.pending:3d} pending {self.paid:3d} paid "
            f"{self.cancelled:3d} cancelled | jobs not finished: {self.jobs_left:3d} | "
            f"payments {self.payments_done}/{self.payments} | {when}"
        )


def wait_for_outcomes(
    order_ids: Sequence[int],
    payments: Sequence[Payment],
    workers: Sequence[subprocess.Popen[bytes]],
    log: Path,
    last_deadline: float,
    report: Callable[[Progress], None],
    grace: float = 60.0,
    redis_run: RunRedis | None = None,
) -> bool:
    """Wait until every payment was made and every job finished; False on time-out.

    ``report`` is called with the progress about five times a second. A worker or the
    private redis-server that exits ends the wait with ``CommandError``.
    """
    start = time.time()
    while True:
        rows = Order.objects.filter(pk__in=order_ids).order_by().values("status")
        counts = {row["status"]: row["n"] for row in rows.annotate(n=Count("pk"))}
        progress = Progress(
            elapsed=time.time() - start,
            pending=counts.get(Order.Status.PENDING, 0),
            paid=counts.get(Order.Status.PAID, 0),
            cancelled=counts.get(Order.Status.CANCELLED, 0),
            jobs_left=unfinished(order_ids),
            payments_done=sum(1 for p in payments if p.outcome),
            payments=len(payments),
            deadlines_in=max(0.0, last_deadline - time.time()),
        )
        report(progress)
        if progress.done:
            return True
        for worker in workers:
            if worker.poll() is not None:
                raise CommandError(
                    f"a worker exited early with code {worker.returncode}:\n{tail(log)}"
                )
        if redis_run is not None:
            redis_run.check()
        if time.time() > last_deadline + grace:
            return False
        time.sleep(0.2)
