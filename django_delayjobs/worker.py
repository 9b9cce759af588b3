"""One worker process: a promoter thread, N worker threads and two housekeeping threads.

Signal handlers only set flags (huey's consumer). The first SIGTERM/SIGINT/SIGHUP stops
claiming, lets running actions finish within ``SHUTDOWN_GRACE_SECONDS`` and hands back
anything claimed but not started; a second one, or a SIGQUIT, exits at once, removing the
process's heartbeat first (within ``EXIT_UNREGISTER_SECONDS``).

A worker that heartbeats is a worker that works: if any of its threads dies, or one that
waits on the database between jobs makes no progress for long (``progress``), the process
stops heartbeating at once, hands back what it can and exits non-zero, so that systemd,
Kubernetes or supervisor restarts it (restarting a thread in place could hide a bug that
kills it again and again). The same goes for an action that runs past ``MAX_RUN_SECONDS``:
its attempt is failed and the process exits, since a thread stuck in an action that never
ends cannot be stopped, and a process whose threads all are would look alive and do
nothing.
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import itertools
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from types import FrameType
from typing import Any, NoReturn

from django.db import Error as DatabaseError
from django.db import connections
from django.utils import timezone

from . import metrics, sql, walcheckpoint
from .conf import delayjobs_settings
from .databases import database_error, database_named, jobs_alias
from .engine import (
    MAX_BATCH,
    Engine,
    EngineUnavailable,
    Leased,
    PartlyUnavailable,
    PerShard,
    WrongType,
    queue_of,
)
from .engine.claims import Claimer
from .engine.errors import first_failure, unreachable
from .engine.sharding import alone
from .exceptions import ConfigurationError, DelayJobsError
from .execution import Execution, receivers_left_behind, unclaim
from .logs import job_fields
from .models import Job
from .outcomes import SETTLED_SECONDS, Outage, Outcome, Result, log_outcome, settle
from .preflight import check_owner, deployment_uid
from .progress import STUCK_BEATS, Progress
from .promoter import BrokenKeys, Promoter
from .reconcile import horizon, reconcile
from .retention import AutoPrune

logger = logging.getLogger("django_delayjobs.worker")

#: ``--burst`` also runs jobs due this soon (seconds).
BURST_SLACK = 0.01
#: How long a delivery that hit a bug in this package waits before it is tried again.
BUG_DELAY = datetime.timedelta(seconds=5)
#: A ``--burst`` run gives up (exit 1) once Redis has been unreachable this long (seconds):
#: a burst always ends.
BURST_REDIS_SECONDS = 5.0
#: Seconds between two flushes of this process's metrics to Redis.
METRICS_FLUSH_SECONDS = 1.0
#: How long past ``MAX_RUN_SECONDS`` (and the shutdown grace) a process whose main thread
#: cannot run (an action holding the GIL in C code) is left frozen before it exits.
FROZEN_SLACK_SECONDS = 5.0
#: The retry of an action failed past ``MAX_RUN_SECONDS`` is due this long after the
#: shutdown grace (seconds): by then the process that still ran it has exited.
OVERRUN_SLACK = 30.0
#: Seconds between two checkpoints of a SQLite database's WAL (see walcheckpoint), run
#: only once jobs have been settled since the last one.
CHECKPOINT_SECONDS = 1.0
#: How long a process that exits at once (a second signal, SIGQUIT) gives the removal of
#: its heartbeat before it exits all the same (seconds).
EXIT_UNREGISTER_SECONDS = 1.0
#: The longest a ``Backoff`` sleeps between two failed calls (seconds).
BACKOFF_MAX_SECONDS = 5.0
#: How long a hand-back waits for the database to undo the claims of the jobs it hands back
#: that never started (``undo_claims``), before it hands them back all the same (seconds):
#: once for the whole hand-back, however many queues, shards and parts it covers.
UNCLAIM_SECONDS = 2.0
#: How much longer the hand-back waits for its undo helper to see its last statement end
#: (each is given only the time left: ``sql.waiting_at_most``) and close its connection.
UNCLAIM_ENDING_SECONDS = 0.5
#: Signals that stop a worker as ``SIGTERM`` does: finish, hand back, exit 0. ``SIGHUP``
#: too: a terminal that closes sends it, and Python's default ended the process with no
#: cleanup at all.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: A waiting id is started only while its lease was last confirmed (by the claim or an
#: extension that kept it, as of when that call was sent) less than this share of
#: ``LEASE_SECONDS`` ago. The rest covers the time from that check to the job's claim in
#: the database; a worker that extends every third of the lease stays well within it.
LEASE_TRUSTED = 0.75


def in_parts(ids: Sequence[str]) -> Iterator[list[str]]:
    """``ids`` in parts of at most ``MAX_BATCH``, as many as one engine call takes: the
    threads of one process may hold more of one queue (``PREFETCH`` is up to 5,000)."""
    for start in range(0, len(ids), MAX_BATCH):
        yield list(ids[start : start + MAX_BATCH])


def lease_every() -> float:
    """Seconds between two extensions of the leases of the jobs a process runs."""
    return max(0.05, delayjobs_settings.LEASE_SECONDS / 3)


class WorkerDied(DelayJobsError):
    """A thread of the worker process died; the process exits non-zero."""


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
    bugs: int = 0  # of the handed-back deliveries, those that met a bug in this package
    max_lag_ms: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, result: Result, *, bug: bool = False) -> None:
        job = result.job
        lag = None
        if result.outcome == Outcome.SUCCEEDED and job is not None and job.started_at:
            lag = (job.started_at - job.run_at).total_seconds() * 1000
        with self.lock:
            self.outcomes[result.outcome.value] += 1
            self.bugs += bug
            if lag is not None and job is not None and job.attempts == 1:
                self.max_lag_ms = max(self.max_lag_ms, lag)

    def count(self) -> int:
        """How many deliveries this process has settled so far."""
        with self.lock:
            return sum(self.outcomes.values())

    def handed_back(self) -> str | None:
        """Why deliveries were handed back, for a burst that fell short; None if none were."""
        with self.lock:
            total, bugs = self.outcomes[Outcome.HANDED_BACK.value], self.bugs
        if not total:
            return None
        why = []
        if total > bugs:
            why.append(f"{total - bugs} as the database was unavailable")
        if bugs:
            why.append(f"{bugs} after an unexpected error in django-delayjobs (a bug)")
        return (f"--burst: handed back {total} job(s) that could not run ({', '.join(why)}; "
                "see the log); they are due again")  # fmt: skip

    def line(self) -> str:
        with self.lock:
            done = sum(self.outcomes.values())
            failed = self.outcomes["retrying"] + self.outcomes["dead"]
            text = f"processed={done} failed={failed} max_lag_ms={self.max_lag_ms:.1f}"
            self.max_lag_ms = 0.0
        return text


def not_a_job_id(queue: str, job_id: str) -> None:
    """Log an id removed from Redis (once: never retried) that is not a job id."""
    logger.warning("queue %s: removed %r from Redis: it is not a job id", queue, job_id)


def drop_connections() -> None:
    """Close this thread's database connections whatever their state, so that the next
    call opens a new one: after a failure or a refusal (a session left read-only, a
    standby reached during a failover) a kept connection could refuse every claim."""
    with contextlib.suppress(DatabaseError):  # a database that is gone
        connections.close_all()


class Backoff:
    """Sleep longer after each consecutive infrastructure error (Redis or database down);
    one log line when an outage starts and one when it ends, not one per failed call.

    An outage ends once calls have succeeded for ``SETTLED_SECONDS`` with no failure: while
    one master of a Cluster fails over, calls to the others succeed between failed ones,
    and that is one outage, not one per call that happened to succeed.

    Given an ``outage``, the lines are its: one per outage for every thread that shares it.
    """

    def __init__(self, stop: threading.Event, what: str, outage: Outage | None = None) -> None:
        self.stop = stop
        self.what = what
        self.outage = outage
        self.delay = 0.0
        self.failures = 0
        self.last_failure = 0.0

    def failed(self, problem: str, exc: BaseException | str, pause: float | None = None) -> None:
        """Log the outage's start, then sleep the backoff's delay, or ``pause`` seconds if
        given: a caller whose pass served the shards it could reach keeps its own pace."""
        if isinstance(exc, WrongType) or isinstance(getattr(exc, "__cause__", None), WrongType):
            problem = "a key of a queue has the wrong type"  # Redis itself answers
        self.delay = self.next_delay()
        if self.outage is not None:
            self.outage.failed(exc)
        else:
            self._failed(problem, exc)
        self.stop.wait(self.delay if pause is None else pause)

    def _failed(self, problem: str, exc: BaseException | str) -> None:
        self.failures += 1
        self.last_failure = time.monotonic()
        if self.failures == 1:
            logger.warning("%s: %s (%s); retrying every %.1f-5 s until it is back", self.what,
                           problem, exc, self.delay)  # fmt: skip

    def next_delay(self) -> float:
        """The delay the next failure sleeps: 0.2 s, doubling up to 5 s."""
        return min(max(self.delay * 2, 0.2), BACKOFF_MAX_SECONDS)

    def ok(self, *, wrote: bool = True) -> None:
        """Calls succeeded; ``wrote=False`` if they only read the database, which does not
        end its outage: a database that answers reads may still refuse every write."""
        self.delay = 0.0
        if self.outage is not None:
            if wrote:
                self.outage.ok()
        elif self.failures and time.monotonic() - self.last_failure >= SETTLED_SECONDS:
            logger.warning("%s: back after %d failed attempt(s)", self.what, self.failures)
            self.failures = 0


class WorkerProcess:
    def __init__(self, engine: Engine, options: Options) -> None:
        self.engine = engine
        self.options = options
        # At most 128 characters (a heartbeat's member, a row's ``worker``), whatever the
        # host's name: the pid and the random part must survive, as the same-process
        # takeover tells processes apart by it (48 random bits: none shared in a fleet).
        self.id = f"{socket.gethostname()[:100]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self.stopping = threading.Event()  # stop claiming
        self.stopped = threading.Event()  # everything is done
        self.fatal: str | None = None  # why the process must exit non-zero
        self.signalled = False  # a stop signal was received: the next one exits at once
        # Worker threads were still busy when the grace ended, left behind: the process
        # must exit now, whatever else would hold it up (see run_delayworker's
        # run_from_argv). ``left_running``: the jobs whose actions still ran then.
        self.abandoned = False
        self.left_running: list[str] = []
        self.stats = Stats()
        self.broken = BrokenKeys()  # one report per broken key, whichever thread meets it
        self.promoter = Promoter(engine, options.queues, tick=options.tick, stop=self.stopping,
                                 broken=self.broken)  # fmt: skip
        self.threads: list[threading.Thread] = []
        # Extends the running jobs' leases; when it died, finish() does it meanwhile.
        self.housekeeper = self.thread("delayjobs-housekeeping", self.housekeep)
        self.workers: list[threading.Thread] = []  # the worker threads (start_threads)
        # job id -> (the shard it was claimed from, by a name that addresses that shard
        # alone; the worker thread that claimed it), for the ids this process holds in
        # flight: their leases are extended there
        self.held: dict[str, tuple[str, int]] = {}
        # held id -> its lease (held_lock): an extension keeps only that one (leases.py)
        self.leases: dict[str, str] = {}
        self.lost: set[str] = set()  # held ids whose lost lease was logged (held_lock)
        # held id -> when its lease was last confirmed (time.monotonic(), held_lock): when
        # the claim or extension that set it was sent, which is no later than Redis set it
        self.confirmed: dict[str, float] = {}
        # A burst's ids let go (``let_go``) and not yet put back in Redis (held_lock): no
        # reconcile sweep runs beside a burst (cron), so it puts them back (``put_back``).
        self.let_gone: set[str] = set()
        # A burst's ids not started as no call could confirm their lease (``leave``): they
        # may still be in flight under this process's lease until it ends (held_lock).
        self.unconfirmed: set[str] = set()
        # While a lease extension is under way, the ids claimed since it began (held_lock):
        # out of flight when it asked, in flight again by now, so not lost.
        self.claimed_meanwhile: set[str] | None = None
        self.running: dict[int, Execution] = {}  # by worker thread (guarded by held_lock)
        # Per queue, which of its shards a claim tries first. Per queue: one counter for
        # all would step a queue by the number of queues tried before it (two queues: its
        # odd shards only, the others starving while those have ids).
        self.turns: defaultdict[str, Iterator[int]] = defaultdict(itertools.count)
        self.held_lock = threading.Lock()
        self.lease_ms = delayjobs_settings.LEASE_SECONDS * 1000
        self.trusted = delayjobs_settings.LEASE_SECONDS * LEASE_TRUSTED  # seconds
        self.prefetch = delayjobs_settings.PREFETCH
        self.outage = Outage(
            "worker", "outcomes are in the database; ids come back with their lease"
        )
        # The database's, shared by every thread that meets it, and ended by any of them:
        # an idle worker's owner check says that it is back (``check_owner``).
        alias = jobs_alias()  # named: the jobs may live on a database of their own
        self.database = Outage("worker", "the jobs wait until it is back", database_named(alias),
                               lambda exc: database_error(exc, alias))  # fmt: skip
        self.beat_lock = threading.Lock()  # a last heartbeat never follows unregister()
        self.unregistered = False  # guarded by beat_lock: no heartbeat is written after
        self.pruner = AutoPrune(engine)  # PRUNE_AFTER_SECONDS; never raises
        self.progress = Progress()  # of the threads that wait on the database between jobs

    # -- lifecycle ---------------------------------------------------------------

    def run(self, also: Sequence[threading.Thread] = ()) -> None:
        """Run until stopped (or, in burst mode, until nothing is due); raise
        ``WorkerDied`` if a thread died, of its own or of ``also`` (started by the caller,
        such as the metrics port's: a worker that runs on without them is not whole)."""
        previous = self.install_signal_handlers()
        walcheckpoint.take_over()
        grace = delayjobs_settings.SHUTDOWN_GRACE_SECONDS
        try:
            self.threads = [*self.start_threads(), *also]
            watched = 0.0
            while not (self.stopping.is_set() or self.signalled):
                if self.options.burst and not any(t.is_alive() for t in self.workers):
                    break
                self.supervise()
                if time.monotonic() - watched >= 1.0:  # each arming is a new C thread
                    watched = time.monotonic()
                    self.watch(grace + 1.0)  # the grace below included
                self.pause(0.2)
            self.stopping.set()
            if self.fatal:
                self.unregister()  # at once: a dying worker must not look alive
            self.finish(grace)
            if any(t.is_alive() for t in self.workers):
                self.abandoned = True
                if running := self.running_ids():
                    self.left_running = running
                    logger.warning("actions still running after %s s; leaving them to their "
                                   "lease (job(s) %s)", grace, ", ".join(running))  # fmt: skip
                else:  # stuck outside any action: a claim, a burst's put_back
                    logger.warning("worker thread(s) still busy after %s s, running no action; "
                                   "exiting without them", grace)  # fmt: skip
                self.hand_back_waiting()
        finally:
            self.stopped.set()
            self.watch(0)
            metrics.last_flush(self.engine, self.options.queues)  # the last second's counts
            self.unregister()
            walcheckpoint.give_back()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            if previous:  # the main thread's: watch() armed it
                faulthandler.cancel_dump_traceback_later()
        if self.fatal:
            raise WorkerDied(self.fatal)
        handed_back = self.stats.handed_back()
        if self.options.burst and handed_back:  # cron must see that a burst fell short
            raise WorkerDied(handed_back)
        if self.let_gone:  # a burst stopped before it could put them back
            raise WorkerDied(f"--burst: {len(self.let_gone)} job(s) whose lease was lost were "
                             "not put back in Redis; they wait for a reconcile sweep "
                             "(manage.py delayjobs_reconcile)")  # fmt: skip
        if self.unconfirmed:  # not run, and maybe in flight under this process's lease
            raise WorkerDied(f"--burst: {len(self.unconfirmed)} job(s) were not run as Redis "
                             "did not answer to confirm their lease; they are due again once "
                             "their lease ends (LEASE_SECONDS), recovered by the next burst or "
                             "a promoter, or, if Redis lost its data, by a reconcile sweep "
                             "(manage.py delayjobs_reconcile)")  # fmt: skip

    def finish(self, grace: float) -> None:
        """Give the running actions ``grace`` seconds to end. If the housekeeping thread
        has died, extend their leases here meanwhile: lapsed, they would let another worker
        run the same jobs beside them."""
        deadline = time.monotonic() + grace
        every = lease_every()
        for thread in self.workers:
            while thread.is_alive() and (left := deadline - time.monotonic()) > 0:
                if not self.housekeeper.is_alive():
                    with contextlib.suppress(EngineUnavailable):  # then they lapse
                        self.extend_leases()
                thread.join(min(left, every))

    def pause(self, seconds: float) -> None:
        """Wait between two rounds of supervision. A burst's ends as soon as its worker
        threads do: each burst ended up to 0.2 s after its last job."""
        if not self.options.burst:
            self.stopping.wait(seconds)
            return
        deadline = time.monotonic() + seconds
        for thread in self.workers:
            thread.join(max(0.0, deadline - time.monotonic()))

    def stop(self) -> None:
        self.stopping.set()

    def die(self, reason: str) -> None:
        """Stop this process with a non-zero exit: something it needs is broken."""
        if self.fatal is None:
            self.fatal = reason
            logger.critical("%s; stopping this worker so that its supervisor restarts it",
                            reason)  # fmt: skip
        self.stopping.set()

    def supervise(self) -> None:
        """Die if a thread that should still run has ended, or is stuck (``Progress``)."""
        for thread in self.threads:
            ended_early = not thread.is_alive() and not self.stopping.is_set()
            done = self.options.burst and thread in self.workers
            if ended_early and not done:  # a burst's worker threads end once nothing is due
                self.die(f"thread {thread.name} ended unexpectedly")
        stuck = self.progress.stuck()
        if stuck is not None and not self.stopping.is_set():
            self.die(stuck)

    def install_signal_handlers(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        handlers = {**dict.fromkeys(STOP_SIGNALS, self.on_signal), signal.SIGQUIT: self.on_quit}
        return {signum: signal.signal(signum, handler) for signum, handler in handlers.items()}

    def watch(self, grace: float) -> None:
        """Exit 1, writing every thread's traceback to stderr, unless called again within
        ``MAX_RUN_SECONDS`` + ``grace`` + ``FROZEN_SLACK_SECONDS``. An action in C code
        that never releases the GIL (a C extension's long loop) stops every thread:
        neither the ``MAX_RUN_SECONDS`` check nor a signal's handler ever runs, and the
        process would hang for good, alive to its supervisor. faulthandler's watchdog is
        a C thread that needs no GIL. Only in the main thread (a real worker process,
        whose signals are its own)."""
        limit = delayjobs_settings.MAX_RUN_SECONDS
        if limit is None or threading.current_thread() is not threading.main_thread():
            return
        faulthandler.dump_traceback_later(limit + grace + FROZEN_SLACK_SECONDS, exit=True,
                                          file=2)  # fmt: skip

    def on_signal(self, signum: int, frame: FrameType | None = None) -> None:
        """SIGTERM/SIGINT: stop; a second one exits at once. Counted by signals received,
        not by ``stopping``: a process that is stopping because something broke (its
        fatal grace) still finishes and hands back on the first one."""
        if self.signalled:
            logger.warning("second signal: exiting now")
            self.exit_now()
        # A flag only, set first: a second signal may run this handler again inside the
        # log call below (Python handlers are re-entered), and must find it set. Not
        # ``stopping.set()``: the handler runs in the main thread, which may be inside
        # ``stopping.wait()`` holding the event's lock (not reentrant), and would wait on
        # it for good. The main loop sets ``stopping`` at its next round (``pause``).
        self.signalled = True
        logger.warning("signal %s: finishing running actions, then exiting", signum)

    def on_quit(self, signum: int, frame: FrameType | None = None) -> None:
        """SIGQUIT (Ctrl-\\): write every thread's traceback to stderr, to see where the
        worker was, and exit at once."""
        with contextlib.suppress(RuntimeError, ValueError, OSError):  # no usable stderr
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        logger.warning("signal %s: exiting now", signum)
        self.exit_now()

    def exit_now(self) -> NoReturn:
        """Exit 1 at once, removing the heartbeat first, so that the admin, the API and
        the health check do not show a dead worker as live for three beats. Within
        ``EXIT_UNREGISTER_SECONDS``: a Redis that hangs (or a heartbeat under way, holding
        ``beat_lock``) must not hold the exit up. Running actions die with the process:
        their transactions roll back, and their ids come back with their leases."""
        with contextlib.suppress(RuntimeError):  # "can't start new thread": exit all the same
            helper = threading.Thread(target=self.unregister, name="delayjobs-exit", daemon=True)
            helper.start()
            helper.join(EXIT_UNREGISTER_SECONDS)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(ValueError, OSError):  # a closed stream, a broken pipe
                stream.flush()
        os._exit(1)

    def redis_threads(self) -> int:
        """How many of this process's threads may each hold a Redis connection at once."""
        roles = 2 if self.options.promoter and not self.options.burst else 0
        return 2 + roles + (self.options.concurrency if self.options.worker else 0)

    def thread(self, name: str, fn: Callable[[], None]) -> threading.Thread:
        return threading.Thread(target=self.guarded(name, fn), name=name, daemon=True)

    def start_threads(self) -> list[threading.Thread]:
        threads = [self.housekeeper,
                   self.thread("delayjobs-housekeeping-db", self.housekeep_database)]  # fmt: skip
        if self.options.promoter and not self.options.burst:
            threads.append(self.thread("delayjobs-promoter", self.promote_loop))
            threads.append(self.thread("delayjobs-reconcile", self.reconcile_loop))
        if self.options.worker:
            self.workers = [self.thread(f"delayjobs-worker-{n}", self.work_loop)
                            for n in range(self.options.concurrency)]  # fmt: skip
        threads += self.workers
        started = []
        for thread in threads:
            try:
                thread.start()
            except RuntimeError as exc:  # "can't start new thread": a process or memory limit
                self.die(f"cannot start thread {thread.name}: {exc}")  # the others stop
                break
            started.append(thread)
        return started

    def guarded(self, name: str, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # a loop only ends like this through a bug
                logger.critical("thread %s died", name, exc_info=True)
                self.die(f"thread {name} died: {exc!r}")
                # What it still holds comes back now, not with its lease: no commit can
                # come from a dead thread (its connections are dropped below).
                self.hand_back_held(threading.get_ident())
            finally:  # this thread's connections, however its loop ended
                drop_connections()

        return run

    # -- loops -------------------------------------------------------------------

    def promote_loop(self) -> None:
        backoff = Backoff(self.stopping, "promoter")
        while not self.stopping.is_set():
            partly = False
            try:
                wait = self.promoter.step()
                backoff.ok()
            except PartlyUnavailable as exc:  # the other shards were served: keep their pace
                backoff.failed("Redis is unavailable", exc, pause=0)
                wait, partly = exc.done, True
            except EngineUnavailable as exc:
                backoff.failed("Redis is unavailable", exc)
                continue
            try:  # woken by an earlier job (on the masters that answer, if one does not)
                self.promoter.sleep(wait)
            except EngineUnavailable as exc:
                backoff.failed("Redis is unavailable", exc, pause=wait if partly else None)

    def reconcile_loop(self) -> None:
        """Repair Redis from the database every RECONCILE_SECONDS, beside the promoter: a
        long sweep (many jobs due within the horizon) must not delay promotion."""
        backoff = Backoff(self.stopping, "reconcile")  # Redis's calls
        database = Backoff(self.stopping, "reconcile", self.database)
        pause = max(delayjobs_settings.RECONCILE_SECONDS, BACKOFF_MAX_SECONDS)
        progress = self.progress.watch(pause)  # and every row read
        while not self.stopping.is_set():
            progress()
            try:
                reconcile(self.engine, horizon=horizon(), progress=progress)
                backoff.ok()
                database.ok(wrote=False)
            except EngineUnavailable as exc:
                # A Cluster's masters that answered were repaired: the next sweep in its
                # time. One Redis that failed partway is down: retried as at the start. A
                # refusal (a key of the wrong type, out of memory, a replica) does not heal
                # by itself, and Redis answers: the next sweep in its time too, not the
                # whole sweep again every few seconds.
                if self.engine.is_cluster:
                    soon = not isinstance(exc, PartlyUnavailable)
                else:
                    soon = unreachable(first_failure(exc))
                wait = None if soon else delayjobs_settings.RECONCILE_SECONDS
                backoff.failed("Redis is unavailable", exc, wait)
                continue
            except DatabaseError as exc:
                drop_connections()
                database.failed("the database is unavailable", exc)
                continue
            sql.close_stale()
            self.stopping.wait(delayjobs_settings.RECONCILE_SECONDS)

    def work_loop(self) -> None:
        backoff = Backoff(self.stopping, "worker")  # Redis's calls
        # The database's, apart: a claim that Redis answers is no end of its outage (it
        # reset the backoff, and each delivery was handed back 0.2 s after the last).
        database = Backoff(self.stopping, "worker", self.database)
        queues = list(self.options.queues)
        redis_lost: float | None = None  # when Redis became unreachable, in a burst
        claimer = Claimer()  # this thread's: a claim whose reply was lost is sent again
        while not self.stopping.is_set():
            try:
                claimed = self.claim(queues, claimer)
                if claimed is None and self.options.burst and self.burst_done():
                    sql.close_stale()
                    return
                backoff.ok()
                redis_lost = None
            except EngineUnavailable as exc:
                if isinstance(exc, PartlyUnavailable) and not self.options.burst:
                    # Some masters answered, none had ids: wait on them as an idle worker
                    # does (the outage logged once), not a backoff's sleep.
                    backoff.failed("Redis is unavailable", exc, pause=0)
                    claimed = None
                else:
                    redis_lost = redis_lost or time.monotonic()
                    if not self.redis_failed(backoff, exc, redis_lost):
                        return
                    continue
            if claimed is None:
                if self.options.burst:
                    continue
                try:
                    if not self.engine.wait_for_work(queues, self.promoter.tick):
                        sql.close_stale()  # idle for a tick: Django's rules apply
                except EngineUnavailable as exc:
                    backoff.failed("Redis is unavailable", exc)
                continue
            self.run_batch(*claimed, database)

    def redis_failed(self, backoff: Backoff, exc: EngineUnavailable, since: float) -> bool:
        """Back off after a failed call to Redis; False when the loop must end instead: a
        burst gives up (and dies) once Redis has been unreachable for
        ``BURST_REDIS_SECONDS``, since a burst always ends."""
        if not self.options.burst:
            backoff.failed("Redis is unavailable", exc)
            return True
        left = since + BURST_REDIS_SECONDS - time.monotonic()
        if left <= 0:
            self.die(f"--burst: Redis has been unreachable for {BURST_REDIS_SECONDS:g} s "
                     f"({exc})")  # fmt: skip
            return False
        backoff.failed("Redis is unavailable", exc, pause=min(backoff.next_delay(), left))
        return True

    def burst_done(self) -> bool:
        """In burst mode with nothing ready: recover expired leases (a burst runs no
        promoter thread, and the id of a worker that was killed is due again once its
        lease ends) and promote what is due; True when nothing is due within
        ``BURST_SLACK`` (so a burst always ends, whatever the tick). Raises
        ``EngineUnavailable``."""
        if self.put_back():
            return False  # claim them
        each = self.promoter.new_pass()
        self.promoter.housekeeping(time.monotonic(), each)
        each.check()
        moved, next_due = self.promoter.promote_due()
        if moved or self.engine_has_ready():
            return False
        if next_due is None or next_due > BURST_SLACK:
            return True
        # Due times round up to the next ms: a job scheduled "now" may still be pending
        # for a moment; burst runs it too.
        self.stopping.wait(next_due)
        return False

    def put_back(self) -> bool:
        """Make Redis hold again the jobs this burst let go (``let_go``); True if there
        were any. After Redis lost its data their rows wait with nothing in Redis, and
        beside a burst run by cron no reconcile sweep may run to put them back. Raises
        ``EngineUnavailable``; a database that fails it, or does not answer (``progress``),
        stops the burst (exit 1)."""
        with self.held_lock:
            ids, self.let_gone = self.let_gone, set()
        if not ids:
            return False
        try:
            with self.progress.watching() as progress:
                reconcile(self.engine, ids=ids, progress=progress)
        except (EngineUnavailable, DatabaseError) as exc:
            with self.held_lock:
                self.let_gone |= ids  # tried again, or counted as left behind
            if isinstance(exc, EngineUnavailable):
                raise
            drop_connections()
            self.die(f"--burst: could not put back in Redis {len(ids)} job(s) whose lease "
                     f"was lost: the database is unavailable ({exc})")  # fmt: skip
            return False
        return True

    def claim(
        self, queues: Sequence[str], claimer: Claimer | None = None
    ) -> tuple[str, list[str]] | None:
        """Claim ids from the first queue (strict priority) that has any; return the shard
        they came from (the queue itself, unless it has several) and the ids.

        Up to ``PREFETCH`` from the first queue, one from the others, so that a job of a
        higher queue waits behind at most the one running job of a lower queue. A queue's
        shards are tried in turn, starting one further at each claim from that queue in
        this process, so none of them starves; the ids are settled in the shard they came from.

        A shard whose master is unreachable (a Cluster failing over) is passed over, and
        the shards of a master that just failed to answer are for ``SKIP_SECONDS`` (the
        promoter's breaker: a frozen master costs each call the client's timeout); the
        error is raised only if no other shard had ids: ``PartlyUnavailable`` if some
        answered (an idle worker then waits on them), else the error itself. One Redis
        that does not answer is raised at once: every other claim would wait for the same
        timeout. A shard with a key of the wrong type is passed over and reported
        (``BrokenKeys``).

        Each shard is claimed alone (``alone``: by its name a queue would also be claimed
        from its old shards, which come in turn by their own), behind its own master's
        breaker; a failure that comes back with the claim (``Leased.failure``: a drop that
        was not answered) opens that breaker too, as one raised does.

        With a ``claimer`` (the calling thread's), a shard's claim that raised is sent
        again as the same call by the next claim from that shard: if Redis ran it after
        the caller gave up (a timeout while Redis stalled), that returns the ids it took,
        which would otherwise wait in flight for their lease to end (one that returned
        ids with a failure is answered: see ``took``).
        """
        failure: EngineUnavailable | None = None
        answered = False
        for queue in queues:
            count = self.prefetch if queue == queues[0] else 1
            shards = self.engine.shards(queue)
            start = next(self.turns[queue]) % len(shards)
            for shard in shards[start:] + shards[:start]:
                token = claimer.token(shard) if claimer is not None else None
                sent = time.monotonic()
                try:
                    with self.promoter.breaker.guard(shard) as trip:  # a frozen master
                        ids = self.engine.claim(alone(shard), count, self.lease_ms, token)
                        if ids.failure is not None:
                            trip(ids.failure)
                except WrongType as exc:  # that shard alone: no outage, no backoff
                    self.broken.report(shard, exc)
                    continue
                except EngineUnavailable as exc:
                    if not self.engine.is_cluster and unreachable(exc):
                        raise  # one Redis: every other claim would wait for the same timeout
                    failure = failure or exc
                    continue
                answered = True
                first = self.took(shard, ids, claimer, sent)
                if ids:
                    return shard, self.hold(shard, ids, sent, first)
                if ids.failure is not None and not isinstance(ids.failure, WrongType):
                    if not self.engine.is_cluster and unreachable(ids.failure):
                        raise ids.failure  # as above (it took only members that are no ids)
                    failure = failure or ids.failure
        if failure is not None and answered:
            raise PartlyUnavailable(str(failure), None) from failure
        if failure is not None:
            raise failure
        return None

    def took(self, shard: str, ids: Leased, claimer: Claimer | None, sent: float) -> float:
        """Note a claim from ``shard`` that was answered; return when the leases of the ids
        it returned as sent again (``Leased.replayed``) were set (``Claimer.since``). The
        next claim from ``shard`` is a new call, even when this one came with a failure
        (``Leased.failure``: its claim was answered, the drop of members that are no ids
        was not). That failure is reported (a key of the wrong type) or, with ids, counted
        in the outage (with none, ``claim`` raises it), and the members the claim took out
        of Redis that are no ids (``Leased.dropped``) are logged."""
        first = sent
        if claimer is not None:
            first = claimer.since(shard, sent, self.lease_ms)
            claimer.answered(shard)
        if isinstance(ids.failure, WrongType):
            self.broken.report(shard, ids.failure)
        elif ids.failure is not None and ids:  # with none, claim() raises it
            self.outage.failed(ids.failure)
        for job_id in ids.dropped:
            not_a_job_id(shard, job_id)
        return first

    def hold(
        self, shard: str, ids: Leased, sent: float | None = None, first: float | None = None
    ) -> list[str]:
        """Hold the ids just claimed for this thread; return those this process did not
        hold already. One it holds came back from Redis while another thread runs it or
        has it in its batch (its lease ended while Redis was frozen, or the reconcile
        sweep gave it back after Redis lost its data): it stays that thread's, in flight
        again under this claim's lease, which the extensions keep. Run here too, it would
        run beside that thread, the second claim reading the first one's running row as
        a delivery whose worker was lost. ``sent``: when the claim was sent (now if not
        given), from which its leases are counted; ``first``: for the ids a call sent again
        returned as its first sending took them (``Leased.replayed``), when that may have
        been (``Claimer.since``; ``sent`` if not given)."""
        with self.held_lock:
            thread = threading.get_ident()
            # Each by its own shard (``Engine.claim`` by a queue's name takes from its older
            # shards too, and that name would extend and hand back in the shard of 1). One held
            # already is held by the shard that has it now, by the thread that holds it.
            fresh = [i for i in ids if i not in self.held]
            self.held.update({i: (ids.shards.get(i, shard), self.held.get(i, ("", thread))[1])
                              for i in ids})  # fmt: skip
            self.unconfirmed.difference_update(ids)  # in flight again under this claim
            self.leases.update(ids.leases)
            sent = time.monotonic() if sent is None else sent
            first = sent if first is None else first
            self.confirmed.update({i: first if i in ids.replayed else sent for i in ids})
            self.lost.difference_update(ids)  # in flight again: this claim's
            if self.claimed_meanwhile is not None:
                self.claimed_meanwhile.update(ids)
        return fresh

    def run_batch(self, queue: str, ids: list[str], backoff: Backoff) -> None:
        acks: list[str] = []
        waiting = deque(job_id for job_id in ids if self.is_job_id(queue, job_id, acks.append))
        claimed: Job | None = None  # the next job's row, claimed by the previous outcome
        thread = threading.get_ident()
        job_id = None
        try:
            while waiting and not (self.stopping.is_set() and claimed is None):
                job_id = waiting.popleft()
                if claimed is None and not self.takes_up(queue, job_id, thread, waiting):
                    continue
                following = waiting[0] if waiting else None

                def then(following: str | None = following) -> str | None:
                    if self.stopping.is_set() or following is None:
                        return None
                    return following if self.holds(following, thread) else None

                claimed = self.process(queue, job_id, backoff, acks.append, claimed, then)
                job_id = None  # settled
        except BaseException as exc:  # this thread dies: the job it was at goes back too
            # The process stops first: no other thread claims an id it hands back (the
            # undo of a claim, late, would then meet that thread's claim of it).
            self.die(f"thread {threading.current_thread().name} died: {exc!r}")
            if job_id is not None and job_id not in acks:
                waiting.appendleft(job_id)
            raise
        finally:  # what never started (stopping, or this thread dies) goes back at once
            try:
                self.hand_back(queue, list(waiting), thread)
            finally:
                with self.held_lock:
                    self.running.pop(thread, None)
                self.settle_batch(queue, ids, acks)

    def holds(self, job_id: str, thread: int) -> bool:
        """Whether worker thread ``thread`` still holds ``job_id``, claimed with its batch:
        not once a lease extension found it out of flight (Redis lost it, or handed it to
        another worker when its lease ended), nor once its lease may have ended unnoticed
        (``gone``). Its row may be running for another delivery by now, and the claim would
        read it as a delivery whose worker was lost: the job would run twice at once. No
        round trip: what the claims and extensions have seen."""
        with self.held_lock:
            return not self.gone(job_id) and self.held.get(job_id, ("", None))[1] == thread

    def takes_up(self, queue: str, job_id: str, thread: int, waiting: deque[str]) -> bool:
        """Whether worker thread ``thread`` may start ``job_id`` now (``holds``); else it
        is let go. One only unconfirmed for long (``gone``, not found lost) is asked about
        first (``reconfirm``): Redis may still hold it in flight under this process's lease
        (extensions held back by a short freeze, or one that timed out), and let go, it
        would wait there, extended by nobody, until that lease ends. The ids ``waiting``
        behind it in its batch, claimed with it, are as old: asked about in the same call,
        and left with it if Redis does not answer (each its own timeout, one after another,
        held a batch of PREFETCH ids up to PREFETCH timeouts). One neither let go nor left
        (another thread's claim took it again meanwhile: ``hold``) is decided about anew."""
        if self.holds(job_id, thread):
            return True
        with self.held_lock:
            mine = self.held.get(job_id, ("", None))[1] == thread and job_id not in self.lost
            stale = [i for i in waiting if self.held.get(i, ("", None))[1] == thread
                     and i not in self.lost and self.gone(i)] if mine else []  # fmt: skip
            asked = {i: self.leases.get(i) for i in (job_id, *stale)} if mine else {}
        kept = self.reconfirm(asked) if mine else set()
        if kept is None:
            left = set(self.leave(asked, thread))
            kept_waiting = [i for i in waiting if i not in left]
            waiting.clear()
            waiting.extend(kept_waiting)
            for left_id in sorted(left):
                logger.warning("job %s: its lease could not be confirmed (Redis did not "
                               "answer); not run here, it is due again once its lease ends",
                               left_id, extra=job_fields(left_id, queue))  # fmt: skip
            if job_id in left:
                return False
        elif job_id in kept:
            return True
        elif self.let_go(queue, job_id, thread):
            return False
        with self.held_lock:
            again = self.held.get(job_id, ("", None))[1] == thread
        return again and self.takes_up(queue, job_id, thread, waiting)

    def reconfirm(self, ids: Iterable[str]) -> set[str] | None:
        """Extend the leases of held ids by the shard that holds each, under the lease held
        (as ``extend`` does); return those kept (confirmed as of when the call was sent),
        the others marked lost; None if Redis did not answer: they may still be in flight
        under this process's lease. A round trip only for ids ``gone`` by time alone."""
        by_shard: dict[str, dict[str, str | None]] = {}
        with self.held_lock:
            for job_id in ids:
                if job_id in self.held and job_id not in self.lost and job_id in self.leases:
                    by_shard.setdefault(self.held[job_id][0], {})[job_id] = self.leases[job_id]
        kept: dict[str, str] = {}
        lost: list[str] = []
        for shard, leases in by_shard.items():
            sent = time.monotonic()
            try:
                extended = self.engine.extend_lease(shard, leases, self.lease_ms).leases
            except EngineUnavailable as exc:
                self.outage.failed(exc)
                return None
            with self.held_lock:
                for job_id, asked in leases.items():
                    if job_id not in self.held or job_id in self.lost:  # released, or found
                        continue  # lost by an extension meanwhile
                    if self.leases.get(job_id) != asked:  # claimed again (or extended)
                        kept[job_id] = self.leases[job_id]  # meanwhile: that call's lease
                    elif job_id in extended:
                        kept[job_id] = self.leases[job_id] = extended[job_id]
                        self.confirmed[job_id] = max(self.confirmed.get(job_id, sent), sent)
                    else:
                        self.lost.add(job_id)
                        lost.append(job_id)
        for job_id in lost:
            logger.warning("lost the lease of job %s; another worker may take it", job_id)
        return set(kept)

    def leave(self, ids: Mapping[str, str | None], thread: int | None) -> list[str]:
        """Stop holding ids whose lease no call could confirm (Redis did not answer), and
        return them: neither started nor handed back, they may be in flight under this
        process's lease, due again once it ends. A burst that leaves any exits non-zero
        (``unconfirmed``): it cannot tell that they will run. Only those still under the
        lease asked about (``ids``: id -> that lease), checked as they are released: one a
        claim took again meanwhile (``hold``) is in flight under that claim's lease."""
        with self.held_lock:
            asked = [i for i, lease in ids.items() if self.leases.get(i) == lease]
            left = self.unhold(asked, thread)
            if self.options.burst:
                self.unconfirmed.update(left)
        return left

    def gone(self, job_id: str) -> bool:
        """Whether a held id's lease may be another worker's now (held_lock held): an
        extension found it lost, or none has confirmed it for ``LEASE_TRUSTED`` of the lease
        (extensions that fail, as to a Redis frozen or cut off, find nothing lost)."""
        confirmed = self.confirmed.get(job_id, -math.inf)
        return job_id in self.lost or time.monotonic() - confirmed > self.trusted

    def let_go(self, queue: str, job_id: str, thread: int | None) -> bool:
        """Leave an id this thread no longer holds to whoever holds it now: neither acked
        nor handed back, which would move the other delivery's id. One that Redis lost is
        added again by the reconcile sweep (its row is still waiting), or in a burst, which
        runs none, by the burst itself before it ends (``put_back``). Only while it is still
        lost, checked as it is released; return whether it was let go."""
        with self.held_lock:
            let = self.lose([job_id], thread)
        self.said_let_go(queue, let)
        return bool(let)

    def lose(self, ids: Iterable[str], owner: int | None) -> list[str]:
        """Stop holding those of ``ids`` (of worker thread ``owner``, if given) that are lost
        (held_lock held), recorded by a burst (``let_gone``); return them. One that another
        thread's claim took again since it was found lost (``hold``) is in flight under
        this process's fresh lease: let go, it would wait there, extended by nobody, and a
        burst, finding it in flight, would put nothing back."""
        let = self.unhold(ids, owner, self.lost)
        if self.options.burst:
            self.let_gone.update(let)
        return let

    @staticmethod
    def said_let_go(queue: str, ids: Iterable[str]) -> None:
        for job_id in ids:
            logger.warning("job %s: its lease was lost before it started; not run here "
                           "(another delivery has it, or it is added again from its row)",
                           job_id, extra=job_fields(job_id, queue))  # fmt: skip

    @staticmethod
    def is_job_id(queue: str, job_id: str, ack: Callable[[str], None]) -> bool:
        """Whether ``job_id`` is a job id as the engine is given them (``str(uuid)``); any
        other, another spelling of one included (upper case, no hyphens: another
        program's), is removed from Redis once, never retried: held ids are told apart by
        their text, so a second spelling would be a second delivery of the same row."""
        try:
            ours = str(uuid.UUID(job_id)) == job_id
        except ValueError:
            ours = False
        if not ours:
            not_a_job_id(queue, job_id)
            ack(job_id)
        return ours

    def process(
        self,
        queue: str,
        job_id: str,
        backoff: Backoff,
        ack: Callable[[str], None],
        claimed: Job | None = None,
        then: Callable[[], str | None] | None = None,
    ) -> Job | None:
        """Run one job (``claimed``: its row, if the previous job claimed it); return the
        row of ``then`` if this job's outcome transaction claimed it."""
        thread = threading.get_ident()
        execution = Execution(queue, job_id, self.id, claimed=claimed, then=then,
                              starts=partial(self.starts, thread))  # fmt: skip
        with self.held_lock:
            self.running[thread] = execution
        # Watched until its signals are sent: a receiver may never return either. Left in
        # ``running`` while the next job it claimed waits, and if this raises (the thread
        # dies): a hand-back finds there the rows claimed that never started (run_batch
        # removes it).
        result = self.execute(execution)
        bug = result is None
        if result is None:
            result = Result(Outcome.HANDED_BACK, retry_at=timezone.now() + BUG_DELAY)
        if result.redis_move != "ack":  # it leaves flight now, not at the batch's
            # end: no more extensions first, or one between the move and the release
            # would find it gone and warn that its lease was lost
            self.release([job_id], thread)
        if settle(self.engine, queue, job_id, result, ack, self.outage):
            receivers_left_behind(execution.db)  # the receivers ran in this thread
        if execution.changed_session():  # by an outcome's signal receiver
            drop_connections()
        if execution.next_job is None:
            with self.held_lock:
                del self.running[thread]
        self.stats.record(result, bug=bug)
        log_outcome(queue, job_id, result)
        if result.outcome == Outcome.HANDED_BACK:
            drop_connections()
            if not bug:  # a bug is logged above: it is no outage
                backoff.failed("the database is unavailable",
                               f"{result.error}; job {job_id} handed back")  # fmt: skip
        else:
            backoff.ok()
        return execution.next_job

    def starts(self, thread: int, execution: Execution) -> bool:
        """Whether worker thread ``thread`` keeps the claim ``execution`` just made (it
        still holds its id: not handed back meanwhile), marking it kept: one section with
        the hand-back's choice of the rows whose claims it undoes (``give_back``)."""
        with self.held_lock:
            execution.kept = self.held.get(execution.job_id, ("", None))[1] == thread
            return execution.kept

    @staticmethod
    def execute(execution: Execution) -> Result | None:
        """Run ``execution``; None after a bug in this package (logged): the thread is
        kept, and the job is tried again later."""
        try:
            return execution.run()
        except Exception:
            logger.exception("job %s: unexpected error; handed back, due again in %s s",
                             execution.job_id, BUG_DELAY.total_seconds())  # fmt: skip
            return None
        finally:
            if execution.changed_session():
                drop_connections()  # the next job runs on a session as Django opens it
            else:
                sql.close_stale(between_jobs=True)

    def settle_batch(self, queue: str, ids: list[str], acks: list[str]) -> None:
        """Stop extending the batch's leases, then ack its finished ids in one call. Not
        the other way round: an extension between the two would find them out of flight
        and warn that their lease was lost. An ack that fails leaves them to their lease."""
        self.release(ids, threading.get_ident())
        try:
            if acks:
                self.engine.ack(queue, acks)
        except EngineUnavailable as exc:
            self.outage.failed(exc)

    def release(self, ids: Iterable[str], owner: int | None = None) -> list[str]:
        """Stop holding ``ids`` (those that worker thread ``owner`` claimed, if given: an
        id it settled may be another thread's by now); return the ids released."""
        with self.held_lock:
            return self.unhold(ids, owner)

    def unhold(
        self, ids: Iterable[str], owner: int | None, only: Container[str] | None = None
    ) -> list[str]:
        """``release`` with held_lock held; only the ids in ``only``, if given."""
        mine = [i for i in ids if i in self.held and owner in (None, self.held[i][1])
                and (only is None or i in only)]  # fmt: skip
        for job_id in mine:
            del self.held[job_id]
            self.leases.pop(job_id, None)
            self.confirmed.pop(job_id, None)
            self.lost.discard(job_id)
        return mine

    def engine_has_ready(self) -> bool:
        ready = 0
        for queue in self.options.queues:
            with self.broken.watch(queue):  # passed over by the claims too
                ready += self.engine.stats(queue).ready
        return ready > 0

    def hand_back(self, queue: str, ids: Sequence[str], owner: int | None = None) -> bool:
        """Return claimed ids that this process (worker thread ``owner``) still holds to
        pending, due now; False if Redis is down: their leases return them."""
        return self.give_back(queue, ids, owner) is not None

    def give_back(
        self, queue: str, ids: Sequence[str], owner: int | None = None,
        until: float | None = None,
    ) -> int | None:  # fmt: skip
        """``hand_back``; return how many ids Redis moved back, None if Redis is down. One
        whose lease was lost is let go (``lose``), not handed back: the worker that holds it
        now may run it. Lost as they are released: found so before, by the call below, or
        by an extension meanwhile; one lost unknown to this process is left in flight by
        the nack itself, which moves only an id under this engine's lease (or no holder's,
        ``adopt``'s). One only unconfirmed for long (``gone``) is asked about first
        (``reconfirm``): handed back if kept. If Redis did not answer that call, or the
        nack, the ids are left to their lease, and a burst counts them (``unconfirmed``):
        after Redis lost its data, only a reconcile sweep would bring them back. A row this
        process claimed for one of them whose action never started is unclaimed first
        (``undo_claims``, by ``until``: a ``time.monotonic()`` deadline, by default
        ``UNCLAIM_SECONDS`` from now)."""
        with self.held_lock:
            stale = [i for i in ids if i in self.held and owner in (None, self.held[i][1])
                     and i not in self.lost and self.gone(i)]  # fmt: skip
        kept = self.reconfirm(stale) if stale else set()
        with self.held_lock:  # one section: one found lost after a check would be nacked
            let = self.lose(ids, owner)
            ids = self.unhold(ids, owner)
            if kept is None and self.options.burst:  # no nack would be answered either
                self.unconfirmed.update(ids)
            # Chosen in the section that released them: their actions never start now
            # (``starts``), and a claim made after this undoes itself.
            rows = [row for e in self.running.values()
                    if (row := e.unstarted()) is not None and str(row.pk) in ids]  # fmt: skip
        self.said_let_go(queue, let)
        self.undo_claims(rows, until)  # Redis down too: their threads never keep them now
        if kept is None:
            return None
        if not ids:
            return 0
        try:
            moved = self.engine.nack(queue, dict.fromkeys(ids, self.engine.server_time_ms()))
        except EngineUnavailable as exc:
            self.outage.failed(exc)
            if self.options.burst:
                with self.held_lock:
                    self.unconfirmed.update(ids)
            return None
        if moved < len(ids):
            logger.warning("%d of %d job(s) handed back were not in flight under this "
                           "worker's lease: left to whoever holds them, or to reconcile if "
                           "Redis lost them", len(ids) - moved, len(ids))  # fmt: skip
        return moved

    def undo_claims(self, rows: list[Job], until: float | None = None) -> None:
        """Undo this process's claims of ``rows``, handed back before the worker kept them
        (``execution.unclaim``), before their ids go back to Redis: each is claimed again
        as the attempt (or delivery) it would have been. In a thread of its own, waited
        for until ``until`` (``time.monotonic()``; ``UNCLAIM_SECONDS`` from now by
        default): a database that does not answer must not hold up the hand-back, nor the
        exit. The helper starts no undo past that time, gives each only the time left to
        wait for the database (``sql.waiting_at_most``), and closes its connection as it ends,
        which the hand-back waits for (``UNCLAIM_ENDING_SECONDS``). Not undone, a row is
        left to its takeover, half a lease after its claim, as when the process is
        killed."""
        if not rows:
            return
        until = time.monotonic() + UNCLAIM_SECONDS if until is None else until
        helper = threading.Thread(target=self.unclaim, args=(rows, until),
                                  name="delayjobs-unclaim", daemon=True)  # fmt: skip
        with contextlib.suppress(RuntimeError):  # "can't start new thread": left to takeover
            helper.start()
            helper.join(max(0.0, until - time.monotonic()) + UNCLAIM_ENDING_SECONDS)
            if helper.is_alive():  # a database that stopped answering mid-statement
                logger.warning("the undo of handed-back claims still waits on the database; "
                               "the worker goes on without it")  # fmt: skip

    def unclaim(self, rows: list[Job], until: float) -> None:
        """``undo_claims``'s helper thread."""
        try:
            for done, row in enumerate(rows):
                if (left := until - time.monotonic()) <= 0:
                    logger.warning("%d claim(s) of job(s) handed back before they started "
                                   "were not undone in time: they run again half a lease "
                                   "after their claim", len(rows) - done)  # fmt: skip
                    break
                try:  # one row's failure (a deadlock, say) leaves the others their turn
                    undone = unclaim(row, self.id, left)
                except DatabaseError as exc:
                    logger.warning("job %s: could not undo the claim of a job handed back "
                                   "before it started (%s): it runs again half a lease "
                                   "after its claim", row.pk, exc,
                                   extra=job_fields(row.pk, row.queue))  # fmt: skip
                    continue
                if undone:
                    logger.info("job %s: handed back before its action started; its claim "
                                "was undone", row.pk,
                                extra=job_fields(row.pk, row.queue))  # fmt: skip
        except Exception:  # a bug: the rows are left to their takeover all the same
            logger.exception("undoing the claim of job(s) handed back failed")
        finally:
            drop_connections()  # this thread's

    def running_ids(self) -> list[str]:
        """The jobs whose actions run (or ran, their outcome not yet settled) in this
        process now: not one whose thread has not called its action yet (its claim
        waiting on the database, say)."""
        with self.held_lock:
            return sorted(e.job_id for e in self.running.values() if e.called)

    def hand_back_waiting(self) -> None:
        """Exiting with actions still running: hand back the ids held that never started
        (claimed with them, or whose claim still waits), instead of leaving them to wait
        for their lease to end; a row claimed for one is unclaimed (``give_back``) if its
        thread had not kept that claim yet, and that thread then never keeps it
        (``starts``). One kept (its signals, its arguments or its action under way) is
        left claimed: its delivery counts, as any lost one's."""
        self.hand_back_held()

    def hand_back_held(self, owner: int | None = None) -> None:
        """Hand back the ids held whose actions do not run now; given an ``owner``, every
        id worker thread ``owner`` held: it died, and no commit can come from a dead
        thread, so one whose action was called goes back too (its row, if left running,
        is taken over as any lost delivery's: at once by this process, by another half a
        lease after its start). The undo of the claims of those that never started has
        ``UNCLAIM_SECONDS`` in all (``undo_claims``)."""
        until = time.monotonic() + UNCLAIM_SECONDS
        with self.held_lock:
            running = {e.job_id for e in self.running.values() if e.called}
            waiting: dict[str, list[str]] = {}
            for job_id, (shard, thread) in self.held.items():
                if owner == thread or (owner is None and job_id not in running):
                    waiting.setdefault(shard, []).append(job_id)
        for shard, ids in waiting.items():  # parts until one fails: the rest would wait too
            handed = 0  # those let go or left to their lease are logged apart
            for start, part in enumerate(in_parts(ids)):
                count = self.give_back(shard, part, owner, until)
                if count is None:
                    logger.warning("could not hand back %d job(s) that had not started: Redis "
                                   "is unavailable; they come back when their lease ends",
                                   len(ids) - start * MAX_BATCH)  # fmt: skip
                    break
                handed += count
            if handed:
                logger.warning("handed back %d job(s) that had not started", handed)

    # -- housekeeping ------------------------------------------------------------

    def housekeep(self) -> None:
        """Extend leases of running jobs, send heartbeats, flush metrics, log the status
        line: Redis only. The database's chores run in a thread of their own
        (``housekeep_database``): a database that hangs under one of them (a lock, a
        network cut) must not stop the lease extensions and heartbeats, or this worker
        would look dead and other workers would run the jobs it is still running."""
        beat_every = delayjobs_settings.HEARTBEAT_SECONDS
        leases_every = min(lease_every(), beat_every)
        status_every = self.options.status_every
        last_leases = last_beat = last_status = 0.0
        backoff = Backoff(self.stopped, "housekeeping")
        while not self.stopped.is_set():
            now = time.monotonic()
            each = PerShard()  # a master that is down stops none of the chores on the others
            self.check_run_times()
            if now - last_leases >= leases_every:
                last_leases = now
                with each.attempt():
                    self.extend_leases()
            if now - last_beat >= beat_every and self.fatal is None:
                last_beat = now
                with each.attempt():
                    self.heartbeat(ttl_ms=beat_every * 3000)
            with each.attempt():
                metrics.flush(self.engine, self.options.queues)
            try:
                each.check()
                backoff.ok()
            except PartlyUnavailable as exc:
                backoff.failed("Redis is unavailable", exc, pause=0)
            except EngineUnavailable as exc:
                # Never past the next lease extension and heartbeat: a failure of one
                # chore (a metrics key of the wrong type fails every flush while Redis
                # serves the rest) must not let this process's leases and beat lapse.
                backoff.failed("Redis is unavailable", exc,
                               pause=min(backoff.next_delay(), leases_every))  # fmt: skip
            if status_every and now - last_status >= status_every:
                last_status = now
                logger.info("status: %s", self.stats.line())
            self.stopped.wait(min(leases_every, METRICS_FLUSH_SECONDS))

    def housekeep_database(self) -> None:
        """Check that this PREFIX is still this deployment's every ``HEARTBEAT_SECONDS``,
        checkpoint SQLite's WAL, prune old jobs (``PRUNE_AFTER_SECONDS``)."""
        beat_every = delayjobs_settings.HEARTBEAT_SECONDS
        last_owner = last_checkpoint = 0.0
        checkpointed = 0  # jobs settled at the last checkpoint
        progress = self.progress.watch(min(beat_every, CHECKPOINT_SECONDS))
        while not self.stopped.is_set():
            progress()
            now = time.monotonic()
            if now - last_owner >= beat_every and self.fatal is None:
                last_owner = now
                self.check_owner()
            settled = self.stats.count()
            if settled != checkpointed and now - last_checkpoint >= CHECKPOINT_SECONDS:
                last_checkpoint, checkpointed = now, settled  # only after work: no idle I/O
                walcheckpoint.checkpoint()
                sql.close_stale()
            self.pruner.step()
            self.stopped.wait(min(beat_every, CHECKPOINT_SECONDS))

    def check_owner(self) -> None:
        """After Redis lost its data another deployment may have claimed this PREFIX. It is
        also this process's contact with the database while it runs no job: a worker left
        idle by an outage still says when the database is back, once it takes a write (a
        database that answers reads may refuse every claim)."""
        try:
            mine = deployment_uid()
            if self.database.failures:  # under way: only a write may end it
                sql.take_a_write()
            self.database.ok()
            check_owner(self.engine, mine)
        except DatabaseError as exc:  # deployment_uid's, or the write's
            self.database.failed(exc)
        except EngineUnavailable:  # Redis's outage: the heartbeat's to log
            pass  # checked again at the next beat
        except ConfigurationError as exc:
            self.die(str(exc))
        finally:
            sql.close_stale()  # this thread's connection: closed between beats

    def check_run_times(self) -> None:
        """Fail the attempt of an action that has run past ``MAX_RUN_SECONDS``, and stop;
        stop too when a worker thread has been stuck that long outside an action, or with
        no limit as long as a database thread may (``progress``): a claim or an outcome on
        a connection left half-open waits for good too."""
        limit = delayjobs_settings.MAX_RUN_SECONDS
        if self.fatal is not None:
            return
        outside = STUCK_BEATS * delayjobs_settings.HEARTBEAT_SECONDS if limit is None else limit
        named = "MAX_RUN_SECONDS" if limit is not None else f"{STUCK_BEATS} HEARTBEAT_SECONDS"
        now = time.monotonic()
        with self.held_lock:
            executions = list(self.running.values())
        for execution in executions:
            running = execution.running_since
            if limit is not None and running is not None and now - running > limit:
                self.overran(execution, limit)
        for execution in executions:
            since = execution.outside_since
            if self.fatal is None and since is not None and now - since > outside:
                self.die(f"job {execution.job_id}: its worker thread has been busy outside the "
                         f"action for more than {named} ({outside:g} s): a signal receiver "
                         "that does not return, or a database that does not answer")  # fmt: skip

    def overran(self, execution: Execution, limit: float) -> None:
        """Stop first, then record the failure in a thread of its own: writing it may wait
        on a lock the stuck action holds (its job's row, or SQLite's write lock) for as long
        as it runs, and this thread's lease extensions must go on through the shutdown
        grace meanwhile, or another worker could run this process's jobs, the stuck one
        included, beside it. The process exits after the grace whether or not the failure
        is written."""
        job = execution.job
        self.die(f"job {execution.job_id} ({job.action if job is not None else '?'}) ran past "
                 f"MAX_RUN_SECONDS ({limit:g} s)")  # fmt: skip
        recorder = threading.Thread(target=self.record_overrun, args=(execution, limit),
                                    name="delayjobs-overrun", daemon=True)  # fmt: skip
        try:
            recorder.start()
        except RuntimeError:  # "can't start new thread": here, then
            self.record_overrun(execution, limit)

    def record_overrun(self, execution: Execution, limit: float) -> None:
        """Fail the attempt of an action past ``MAX_RUN_SECONDS`` and settle it. The
        action runs on until this process exits, at once after the grace for the other
        actions and the last calls to Redis (heartbeat, hand-backs, metrics: a socket
        timeout each at worst; ``run_delayworker`` ends a process that left an action
        running with ``exit_now``), all timed from ``die()``, before this: its retry is
        due once that is over, ``OVERRUN_SLACK`` after the grace.
        Called in-process, the command cannot end the process, and says so. Handed back
        (the database failed the write), the id is left to its lease: the row, running
        since past ``MAX_RUN_SECONDS``, would be taken over at once, beside the action."""
        job_id, queue = execution.job_id, execution.queue
        grace = delayjobs_settings.SHUTDOWN_GRACE_SECONDS
        gone_in = datetime.timedelta(seconds=grace + OVERRUN_SLACK)
        try:
            result = execution.overran(limit, gone_in)
            if result.outcome == Outcome.HANDED_BACK:
                logger.error("job %s ran past MAX_RUN_SECONDS; its failure could not be "
                             "recorded (%s): it is due again once its lease ends", job_id,
                             result.error)  # fmt: skip
            elif result.outcome != Outcome.OVERTAKEN:  # overtaken: its own outcome came first
                self.release([job_id])
                settle(self.engine, queue, job_id, result, outage=self.outage)
                self.stats.record(result)
                log_outcome(queue, job_id, result)
        except DatabaseError as exc:  # its lease runs out once this process has exited
            logger.error("job %s ran past MAX_RUN_SECONDS; its failure could not be recorded "
                         "(%s)", job_id, exc)  # fmt: skip
        except Exception:  # a bug: the process is stopping all the same
            logger.exception("job %s ran past MAX_RUN_SECONDS; recording its failure failed",
                             job_id)  # fmt: skip
        finally:
            drop_connections()  # this thread's

    def extend_leases(self) -> None:
        """Extend the leases this process holds. An id whose row this process claimed, its
        action to run here, is kept whoever holds its lease now: the one the reconcile
        sweep gave a running job after Redis lost its data (its holder is this process),
        or the lease of another worker that claimed it once this one's had ended (then it
        is this process that runs it, and that worker, finding its lease gone, does not
        start it too). An id that waits in its batch, or whose row claim has not returned,
        is kept only under the lease this process holds (leases.py): once another worker
        holds it, it is lost here and not started (``holds``); taken while the claim
        decides to defer or hand it back, it would be this process's to nack, out of the
        other worker's lease into pending, where a third would take it over."""
        with self.held_lock:
            running = {e.job_id for e in self.running.values() if e.row_claimed}
            by_queue: dict[str, dict[str, str | None]] = {}
            for job_id, (queue, _) in self.held.items():
                lease = None if job_id in running else self.leases.get(job_id)
                by_queue.setdefault(queue, {})[job_id] = lease
            self.claimed_meanwhile = set()
        each = self.each_queue()  # a shard whose master is down must not stop the others'
        try:
            for queue, ids in by_queue.items():
                for part in in_parts(list(ids)):
                    each.run(partial(self.extend, queue, {i: ids[i] for i in part}), None)
        finally:
            with self.held_lock:
                self.claimed_meanwhile = None
        each.check()

    def extend(self, queue: str, ids: dict[str, str | None]) -> None:
        """Extend the leases of ``ids`` (id -> the lease held, or None: whoever holds it);
        mark (and log once) those found out of flight, or under another worker's lease,
        and not claimed again since: the batch that holds one no longer runs it."""
        sent = time.monotonic()
        kept = self.engine.extend_lease(queue, ids, self.lease_ms)
        home = queue_of(queue)
        astray = {i: None for i, lease in ids.items() if lease is None and i not in kept.leases}
        moved: dict[str, str] = {}
        unknown: set[str] = set()  # not told: not lost either
        if astray and home != queue:  # a running id adopted in its home shard (Redis lost it)
            try:  # by the queue's name: in each id's home shard
                moved = self.engine.extend_lease(home, astray, self.lease_ms).leases
            except EngineUnavailable:  # the next extension asks again; the rest are kept
                unknown = set(astray)
            kept.leases.update(moved)
        with self.held_lock:  # each once: a long action would warn every extension
            for job_id in moved:  # held by its queue's name now: its home shard
                if job_id in self.held:
                    self.held[job_id] = (home, self.held[job_id][1])
            again = self.claimed_meanwhile or set()
            # Not one claimed again meanwhile: that claim's lease may be the newer one.
            mine = {i: lease for i, lease in kept.leases.items()
                    if i in self.held and i not in again}  # fmt: skip
            self.leases.update(mine)
            self.confirmed.update(dict.fromkeys(mine, sent))
            lost = [i for i in ids if i not in kept.leases and i in self.held
                    and i not in self.lost and i not in again and i not in unknown]  # fmt: skip
            self.lost.update(lost)
        for job_id in lost:  # held here, yet Redis no longer has it in flight under our lease
            logger.warning("lost the lease of job %s; another worker may take it", job_id)

    def each_queue(self) -> PerShard:
        """What a call per queue notes its failures in: on one Redis, the first call it
        does not answer ends the round, as in the promoter (``Promoter.new_pass``): every
        other queue's call would wait for the same timeout, and a stop took one per queue
        to remove the heartbeat (and each heartbeat as long) on a Redis frozen or cut off."""
        return PerShard(one_server=not self.engine.is_cluster)

    def heartbeat(self, ttl_ms: float) -> None:
        """Record this process as live for ``ttl_ms`` (0: remove it); a process that is
        stopping because something broke is never recorded again."""
        info = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "roles": [r for r in ("promoter", "worker") if getattr(self.options, r)],
            "concurrency": self.options.concurrency,
            "queues": list(self.options.queues),
        }
        with self.beat_lock:
            ended = self.unregistered or self.stopped.is_set() or self.fatal is not None
            if ttl_ms and ended:
                return
            each = self.each_queue()
            for queue in self.options.queues:
                each.run(partial(self.engine.heartbeat, queue, self.id, ttl_ms, info), None)
            each.check()

    def unregister(self) -> None:
        """Remove this process's heartbeat, for good: a heartbeat that was on its way (the
        housekeeping thread past its check of ``stopped``) writes nothing after."""
        with self.beat_lock:
            self.unregistered = True
        with contextlib.suppress(EngineUnavailable):
            self.heartbeat(ttl_ms=0)
