"""One worker process: a promoter thread, N worker threads and a housekeeping thread.

Signal handlers only set flags (huey's consumer). The first SIGTERM/SIGINT stops claiming,
lets running actions finish within ``SHUTDOWN_GRACE_SECONDS`` and hands back anything
claimed but not started; a second one exits at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from django.db import Error as DatabaseError
from django.db import close_old_connections, connections

from .conf import delayjobs_settings
from .engine import Engine, EngineUnavailable
from .execution import Execution
from .promoter import Promoter
from .reconcile import horizon, reconcile

logger = logging.getLogger("django_delayjobs.worker")

#: ``--burst`` also runs jobs due this soon (seconds).
BURST_SLACK = 0.01


@dataclass
class Options:
    queues: Sequence[str]
    concurrency: int = 1
    promoter: bool = True
    worker: bool = True
    burst: bool = False
    tick: float | None = None
    status_every: float = 0.0  # seconds between status lines; 0 = none


@dataclass
class Stats:
    """Counters shared by the threads of one process (guarded by ``lock``)."""

    outcomes: Counter[str] = field(default_factory=Counter)
    max_lag_ms: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, outcome: str, lag_ms: float | None) -> None:
        with self.lock:
            self.outcomes[outcome] += 1
            if lag_ms is not None:
                self.max_lag_ms = max(self.max_lag_ms, lag_ms)

    def line(self) -> str:
        with self.lock:
            done = sum(self.outcomes.values())
            failed = self.outcomes["retrying"] + self.outcomes["dead"]
            text = f"processed={done} failed={failed} max_lag_ms={self.max_lag_ms:.1f}"
            self.max_lag_ms = 0.0
        return text


def keep_connections() -> None:
    """Between two jobs: keep the database connections for the next one.

    ``CONN_MAX_AGE = 0`` means one connection per request; a worker's "request" lasts
    until it has had no work for a whole tick (``close_old_connections()`` runs then),
    since a new connection per job costs more than a short job. Broken connections, and
    ones older than a non-zero ``CONN_MAX_AGE``, are closed here too.
    """
    for conn in connections.all(initialized_only=True):
        if conn.errors_occurred or conn.settings_dict["CONN_MAX_AGE"]:
            conn.close_if_unusable_or_obsolete()


class Backoff:
    """Sleep longer after each consecutive infrastructure error (Redis or database down)."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.delay = 0.0

    def failed(self, what: str, exc: BaseException) -> None:
        self.delay = min(max(self.delay * 2, 0.2), 5.0)
        logger.warning("%s (%s); retrying in %.1f s", what, exc, self.delay)
        self.stop.wait(self.delay)

    def ok(self) -> None:
        if self.delay:
            logger.warning("connection is back")
        self.delay = 0.0


class WorkerProcess:
    def __init__(self, engine: Engine, options: Options) -> None:
        self.engine = engine
        self.options = options
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.stopping = threading.Event()  # stop claiming
        self.stopped = threading.Event()  # everything is done
        self.stats = Stats()
        self.promoter = Promoter(engine, options.queues, tick=options.tick, stop=self.stopping)
        # job id -> queue, for the ids this process holds a lease on
        self.held: dict[str, str] = {}
        self.held_lock = threading.Lock()
        self.lease_ms = delayjobs_settings.LEASE_SECONDS * 1000
        self.prefetch = delayjobs_settings.PREFETCH

    # -- lifecycle ---------------------------------------------------------------

    def run(self) -> None:
        """Run until stopped (or, in burst mode, until nothing is due)."""
        previous = self.install_signal_handlers()
        threads = self.start_threads()
        try:
            workers = [t for t in threads if t.name.startswith("delayjobs-worker")]
            while not self.stopping.is_set():
                if self.options.burst and not any(t.is_alive() for t in workers):
                    break
                self.stopping.wait(0.2)
            self.stopping.set()
            grace = delayjobs_settings.SHUTDOWN_GRACE_SECONDS
            deadline = time.monotonic() + grace
            for thread in workers:
                thread.join(max(0.0, deadline - time.monotonic()))
            if any(t.is_alive() for t in workers):
                logger.warning("actions still running after %s s; leaving them to their lease",
                               grace)  # fmt: skip
        finally:
            self.stopped.set()
            self.unregister()
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def stop(self) -> None:
        self.stopping.set()

    def install_signal_handlers(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def handle(signum: int, frame: FrameType | None) -> None:
            if self.stopping.is_set():
                logger.warning("second signal: exiting now")
                os._exit(1)
            logger.warning("signal %s: finishing running actions, then exiting", signum)
            self.stopping.set()

        return {s: signal.signal(s, handle) for s in (signal.SIGTERM, signal.SIGINT)}

    def start_threads(self) -> list[threading.Thread]:
        targets: list[tuple[str, Callable[[], None]]] = [("delayjobs-housekeeping", self.housekeep)]
        if self.options.promoter and not self.options.burst:
            targets.append(("delayjobs-promoter", self.promote_loop))
            targets.append(("delayjobs-reconcile", self.reconcile_loop))
        if self.options.worker:
            targets += [(f"delayjobs-worker-{n}", self.work_loop)
                        for n in range(self.options.concurrency)]  # fmt: skip
        threads = [threading.Thread(target=fn, name=name, daemon=True) for name, fn in targets]
        for thread in threads:
            thread.start()
        return threads

    # -- loops -------------------------------------------------------------------

    def promote_loop(self) -> None:
        backoff = Backoff(self.stopping)
        while not self.stopping.is_set():
            try:
                wait = self.promoter.step()
                backoff.ok()
                self.promoter.sleep(wait)
            except EngineUnavailable as exc:
                backoff.failed("promoter: Redis is unavailable", exc)

    def reconcile_loop(self) -> None:
        """Repair Redis from the database every RECONCILE_SECONDS, beside the promoter: a
        long sweep (many jobs due within the horizon) must not delay promotion."""
        backoff = Backoff(self.stopping)
        while not self.stopping.is_set():
            try:
                reconcile(self.engine, horizon=horizon())
                backoff.ok()
            except EngineUnavailable as exc:
                backoff.failed("reconcile: Redis is unavailable", exc)
                continue
            except DatabaseError as exc:
                close_old_connections()
                backoff.failed("reconcile: the database is unavailable", exc)
                continue
            close_old_connections()
            self.stopping.wait(delayjobs_settings.RECONCILE_SECONDS)

    def work_loop(self) -> None:
        backoff = Backoff(self.stopping)
        queues = list(self.options.queues)
        while not self.stopping.is_set():
            try:
                claimed = self.claim(queues)
                backoff.ok()
            except EngineUnavailable as exc:
                backoff.failed("worker: Redis is unavailable", exc)
                continue
            if claimed is None:
                if self.options.burst:
                    moved, wait = self.promoter.promote_due()
                    if moved == 0 and not self.engine_has_ready():
                        if wait > BURST_SLACK:
                            close_old_connections()
                            return
                        # Due times round up to the next ms: a job scheduled "now" may
                        # still be pending for a moment; burst runs it too.
                        self.stopping.wait(wait)
                    continue
                try:
                    if not self.engine.wait_for_work(queues, self.promoter.tick):
                        close_old_connections()  # idle for a tick: Django's rules apply
                except EngineUnavailable as exc:
                    backoff.failed("worker: Redis is unavailable", exc)
                continue
            queue, ids = claimed
            acks: list[str] = []
            try:
                for n, job_id in enumerate(ids):
                    if self.stopping.is_set():  # claimed but not started: hand them back
                        self.hand_back(queue, ids[n:], delay_ms=0)
                        break
                    self.process(queue, job_id, backoff, acks.append)
            finally:
                self.settle_batch(queue, ids, acks)

    def claim(self, queues: Sequence[str]) -> tuple[str, list[str]] | None:
        """Claim ids from the first queue (strict priority) that has any.

        Up to ``PREFETCH`` from the first queue, one from the others, so that a job of a
        higher queue waits behind at most the one running job of a lower queue.
        """
        for queue in queues:
            count = self.prefetch if queue == queues[0] else 1
            ids = self.engine.claim(queue, count, self.lease_ms)
            if ids:
                with self.held_lock:
                    self.held.update(dict.fromkeys(ids, queue))
                return queue, ids
        return None

    def settle_batch(self, queue: str, ids: list[str], acks: list[str]) -> None:
        """Ack the finished ids in one call and stop extending the batch's leases."""
        try:
            if acks:
                self.engine.ack(queue, acks)
        except EngineUnavailable:
            logger.warning("could not ack %d job(s); their leases will expire", len(acks))
        finally:
            with self.held_lock:
                for job_id in ids:
                    self.held.pop(job_id, None)

    def engine_has_ready(self) -> bool:
        return any(self.engine.stats(q).ready for q in self.options.queues)

    def process(
        self, queue: str, job_id: str, backoff: Backoff, ack: Callable[[str], None]
    ) -> None:
        execution = Execution(self.engine, queue, job_id, self.id, ack)
        try:
            outcome = execution.run()
            backoff.ok()
            job = execution.job
            lag = None
            if job is not None and job.started_at is not None and job.attempts == 1:
                lag = (job.started_at - job.run_at).total_seconds() * 1000
            self.stats.record(outcome, lag)
            logger.debug("job %s: %s", job_id, outcome)
        except DatabaseError as exc:
            close_old_connections()
            self.hand_back(queue, [job_id], delay_ms=1000)
            backoff.failed(f"job {job_id}: the database is unavailable", exc)
        except EngineUnavailable as exc:
            # The outcome (if any) is committed; the lease will expire and the next
            # delivery finds the row finished and just acks it.
            backoff.failed(f"job {job_id}: Redis is unavailable", exc)
        except Exception:  # a bug, here or below: keep the thread, retry the job later
            logger.exception("job %s: unexpected error; handing it back", job_id)
            self.hand_back(queue, [job_id], delay_ms=5000)
        finally:
            keep_connections()

    def hand_back(self, queue: str, ids: Sequence[str], delay_ms: int) -> None:
        """Return claimed ids to pending; if Redis is down their leases return them later."""
        try:
            due = self.engine.server_time_ms() + delay_ms
            self.engine.nack(queue, dict.fromkeys(ids, due))
        except EngineUnavailable:
            logger.warning("could not hand back %s; the lease will expire", ", ".join(ids))
        with self.held_lock:
            for job_id in ids:
                self.held.pop(job_id, None)

    # -- housekeeping ------------------------------------------------------------

    def housekeep(self) -> None:
        """Extend leases of running jobs, send heartbeats, log the status line."""
        lease_every = max(0.05, delayjobs_settings.LEASE_SECONDS / 3)
        beat_every = delayjobs_settings.HEARTBEAT_SECONDS
        status_every = self.options.status_every
        last_beat = last_status = 0.0
        while not self.stopped.is_set():
            now = time.monotonic()
            try:
                self.extend_leases()
                if now - last_beat >= beat_every:
                    last_beat = now
                    self.heartbeat(ttl_ms=beat_every * 3000)
            except EngineUnavailable as exc:
                logger.warning("housekeeping: Redis is unavailable (%s)", exc)
            if status_every and now - last_status >= status_every:
                last_status = now
                logger.info("status: %s", self.stats.line())
            self.stopped.wait(min(lease_every, beat_every))

    def extend_leases(self) -> None:
        with self.held_lock:
            by_queue: dict[str, list[str]] = {}
            for job_id, queue in self.held.items():
                by_queue.setdefault(queue, []).append(job_id)
        for queue, ids in by_queue.items():
            kept = set(self.engine.extend_lease(queue, ids, self.lease_ms))
            with self.held_lock:
                lost = [i for i in ids if i not in kept and i in self.held]
            for job_id in lost:  # still running here, yet Redis no longer has it in flight
                logger.warning("lost the lease of job %s; another worker may take it", job_id)

    def heartbeat(self, ttl_ms: float) -> None:
        info = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "roles": [r for r in ("promoter", "worker") if getattr(self.options, r)],
            "concurrency": self.options.concurrency,
            "queues": list(self.options.queues),
        }
        for queue in self.options.queues:
            self.engine.heartbeat(queue, self.id, ttl_ms, info)

    def unregister(self) -> None:
        with contextlib.suppress(EngineUnavailable):
            self.heartbeat(ttl_ms=0)
