"""What one delivery of a job came to, the retry policy that decides it, and the one place
that hands an outcome to Redis and then to signal receivers.

The database is written first, by ``Execution`` (one fenced statement per outcome); only
then does ``settle`` tell Redis and send signals. A Redis failure there is logged and the
signals still go out: the outcome is already the database's, and an unacknowledged id
comes back when its lease ends, finds its row finished and is dropped.
"""

from __future__ import annotations

import contextlib
import datetime
import enum
import logging
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from . import metrics, signals, sql, timing
from .conf import delayjobs_settings
from .engine import Engine, EngineUnavailable, queue_of
from .exceptions import GiveUp, Retry
from .logs import job_fields, one_line
from .models import Status

if TYPE_CHECKING:
    from .models import Job

logger = logging.getLogger("django_delayjobs.worker")


class Outcome(enum.StrEnum):
    """What one delivery came to. The first four are job statuses."""

    SUCCEEDED = "succeeded"  # the action returned; its effects committed with the outcome
    RETRYING = "retrying"  # the action failed; a later attempt is due at ``retry_at``
    DEAD = "dead"  # failed for good (or the row cannot be run at all)
    SKIPPED = "skipped"  # target row gone, or past ``expires_at``
    DROPPED = "dropped"  # nothing to run: cancelled, finished, deleted, or not a job id
    DEFERRED = "deferred"  # not due yet (rescheduled), or running too recently to take over
    HANDED_BACK = "handed_back"  # the database or Redis failed: the same attempt runs again
    OVERTAKEN = "overtaken"  # another delivery owns the row now; nothing was written
    #: handed back before the worker kept its claim (it is stopping, or a thread died):
    #: the claim undone, the id moved by the hand-back
    UNCLAIMED = "unclaimed"

    @property
    def redis_move(self) -> str:
        """What Redis does with the id: ``ack``, ``nack`` (back to pending), ``bury``, or
        ``none`` (the id belongs to the delivery that overtook this one, or to the
        hand-back that took it from this one)."""
        return _MOVES[self]


_MOVES = {
    Outcome.SUCCEEDED: "ack", Outcome.SKIPPED: "ack", Outcome.DROPPED: "ack",
    Outcome.RETRYING: "nack", Outcome.DEFERRED: "nack", Outcome.HANDED_BACK: "nack",
    Outcome.DEAD: "bury", Outcome.OVERTAKEN: "none", Outcome.UNCLAIMED: "none",
}  # fmt: skip


@dataclass
class Result:
    """One delivery's outcome, as written to the database."""

    outcome: Outcome
    job: Job | None = None
    error: str = ""  # why it failed, died or was skipped (the history's text) or handed back
    failed: bool = False  # the action itself raised: ``job_failed`` is sent
    retry_at: datetime.datetime | None = None  # when a nacked id is due again
    duration: float | None = None  # seconds the action ran

    @property
    def redis_move(self) -> str:
        """The outcome's move (``Outcome.redis_move``), except for an id dropped because
        its row is dead: it goes to garbage, where a dead job's id is kept. Its own move
        there was lost (its worker killed, or Redis unreachable, after the outcome
        committed), and the id came back with its lease."""
        job = self.job
        if self.outcome == Outcome.DROPPED and job is not None and job.status == Status.DEAD:
            return "bury"
        return self.outcome.redis_move


# -- the retry policy ------------------------------------------------------------------


def backoff_seconds(attempt: int) -> float:
    """Exponential backoff with jitter: base * 2**(attempt-1), capped, times 0.5-1.0."""
    settings = delayjobs_settings
    base = settings.RETRY_BACKOFF_SECONDS * 2.0 ** min(max(attempt, 1) - 1, 30)
    return min(base, settings.RETRY_BACKOFF_MAX_SECONDS) * random.uniform(0.5, 1.0)


#: The longest ``Retry(after=...)`` honoured (a receiver's ``Retry-After`` of a year is not).
MAX_RETRY_AFTER = datetime.timedelta(days=1)


def after_failure(
    job: Job, exc: BaseException, at_least: datetime.timedelta = datetime.timedelta(0)
) -> tuple[Outcome, datetime.datetime | None]:
    """Decide what a failed attempt leads to: ``(DEAD, None)``, ``(RETRYING, when)``, or
    ``(SKIPPED, when)`` if the next attempt would be due at or after the job's
    ``expires_at`` (a claim then would only skip it). The next attempt is due in
    ``at_least`` at the soonest.

    The one place that says whether attempts are left and when the next one is due. An
    exception group (an asyncio ``TaskGroup``'s) is what it holds: a ``GiveUp`` anywhere
    in it gives up, and the next attempt waits for the longest ``Retry`` in it asks.
    """
    raised = leaves(exc)
    if any(isinstance(leaf, GiveUp) for leaf in raised) or job.attempts >= job.max_attempts:
        return Outcome.DEAD, None
    asked = [after for leaf in raised if (after := retry_after(leaf)) is not None]
    if asked:
        delay = datetime.timedelta(seconds=min(max(max(asked), 0.0), 86_400.0))
    else:
        delay = datetime.timedelta(seconds=backoff_seconds(job.attempts))
    retry_at = timezone.now() + max(min(delay, MAX_RETRY_AFTER), at_least)
    if job.expires_at is not None and retry_at >= job.expires_at:
        return Outcome.SKIPPED, retry_at
    return Outcome.RETRYING, retry_at


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions ``exc`` stands for: itself, or those an exception group holds, at
    any depth. The group is the action's: one whose ``exceptions`` cannot be read, or
    holds a group seen already, stands for itself."""
    found: list[BaseException] = []
    seen: set[int] = set()
    stack = [exc]
    while stack:  # not recursive: a group nested past the recursion limit is no bug here
        current = stack.pop()
        inner: tuple[BaseException, ...] = ()
        if isinstance(current, BaseExceptionGroup) and id(current) not in seen:
            seen.add(id(current))
            with contextlib.suppress(Exception):
                inner = tuple(current.exceptions)
        if inner:
            stack.extend(reversed(inner))
        else:
            found.append(current)
    return found


def retry_after(exc: BaseException) -> float | None:
    """The delay in seconds that ``exc``, a ``Retry``, asks for; None for the usual
    backoff: none asked, NaN (computed from a bad header, say), or no number at all. The
    exception is the action's: a subclass that never ran ``Retry.__init__`` has no
    ``after``, and one may be set to anything after ``__init__`` checked it."""
    if not isinstance(exc, Retry):
        return None
    try:
        after = exc.after
    except Exception:
        return None
    if isinstance(after, datetime.timedelta):
        after = after.total_seconds()
    if isinstance(after, bool) or not isinstance(after, int | float):
        return None
    return None if isinstance(after, float) and math.isnan(after) else after


# -- settling: Redis, then signals ---------------------------------------------------------


#: How long calls must succeed without a failure before an outage counts as over.
SETTLED_SECONDS = 2.0


class Outage:
    """Logs an outage of Redis (or of ``service``) once, counts what failed while it
    lasts, and says when it ends. One may be shared by the threads of a process.

    It ends once calls succeed and none has failed for ``SETTLED_SECONDS`` (said at the
    next call, which may be the first failure of the next outage): while one master of a
    Cluster is down, calls to the shards on the others succeed between the failed ones,
    and that is one outage, not one per call that happened to succeed.
    """

    def __init__(
        self,
        what: str,
        consequence: str,
        service: str = "Redis",
        describe: Callable[[BaseException | str], str] | None = None,
    ) -> None:
        self.what = what
        self.consequence = consequence
        self.service = service
        # The outage's first line, from its first error (default: "<service> is
        # unavailable (<error>)").
        self.describe = describe or (lambda exc: f"{service} is unavailable ({exc})")
        self.failures = 0
        self.since: datetime.datetime | None = None
        self.last_failure = self.last_ok = 0.0  # time.monotonic()
        self.lock = threading.Lock()  # one line per outage, whichever threads meet it

    def failed(self, exc: BaseException | str) -> None:
        with self.lock:
            now = time.monotonic()
            if self.failures and self.last_ok > self.last_failure:
                self._end(now)  # calls succeeded after the last failure: maybe long ago
            self.failures += 1
            self.last_failure = now
            if self.failures == 1:
                self.since = timezone.now()
                logger.warning("%s: %s; %s", self.what, self.describe(exc), self.consequence)

    def ok(self) -> None:
        with self.lock:
            self.last_ok = time.monotonic()
            self._end(self.last_ok)

    def _end(self, now: float) -> None:
        if self.failures and now - self.last_failure >= SETTLED_SECONDS:
            logger.warning("%s: %s is back after %d failed call(s) since %s", self.what,
                           self.service, self.failures, self.since)  # fmt: skip
            self.failures = 0


_OUTAGE = Outage("worker", "outcomes are in the database; ids come back with their lease")


def settle(
    engine: Engine,
    queue: str,
    job_id: str,
    result: Result,
    ack: Callable[[str], None] | None = None,
    outage: Outage = _OUTAGE,
) -> bool:
    """Tell Redis what became of ``job_id``, count it, then send the outcome's signals;
    True if they had receivers. Never raises.

    ``ack`` may collect ids to acknowledge later in one call (acking late is safe: a
    redelivered id finds its row finished and is dropped); by default it acks at once.
    """
    try:
        move = result.redis_move
        if move == "ack":
            if ack is None:
                engine.ack(queue, [job_id])
            else:
                ack(job_id)
        elif move == "bury":
            engine.bury(queue, [job_id])
        elif move == "nack":
            due = result.retry_at or timezone.now()
            due_ms = timing.to_ms(due)
            if result.outcome == Outcome.DEFERRED:
                # Not due on this host's clock: wait as long on Redis's, which says what is
                # due. Due at run_at, a host whose clock is behind Redis's would be handed
                # the job back at once, and again, until its clock caught up.
                wait_ms = max(0, due_ms - timing.to_ms(timezone.now()))
                due_ms = engine.server_time_ms() + wait_ms
            moved = engine.nack(queue, {job_id: due_ms})
            if result.outcome in _FOLLOW_ROW:
                # Moved nothing: the id was not in flight under this engine's lease. Redis
                # lost it and another worker, given it back, deferred it (pending at its own
                # due time), or it is gone: the row's due time is pushed whatever it is. Or
                # another worker claimed it since (this one's lease was lost: nack.lua): a
                # running row is left to it, a waiting row's push (add) leaves it in flight,
                # and that worker's delivery reads the row and moves the id.
                follow_row(engine, queue, job_id, timing.to_ms(due) if moved else None)
        outage.ok()
    except EngineUnavailable as exc:
        outage.failed(exc)
    # In memory; the worker's housekeeping flushes it. Counted per queue, whatever shard.
    metrics.record(queue_of(queue), result)
    return send_signals(result)


#: The nacks whose due time was read from the row, which a reschedule may change before
#: the nack: the row's ``run_at`` is read again after it (one query, on these paths only;
#: a reschedule's push is followed so too, by ``services._push_rescheduled``).
_FOLLOW_ROW = frozenset({Outcome.RETRYING, Outcome.DEFERRED})


def follow_row(
    engine: Engine, queue: str, job_id: str, pushed_ms: float | None, *, held: bool = True
) -> None:
    """Make Redis agree with ``job_id``'s row after a push of the id due at ``pushed_ms``:
    a nack (due as the row gave it, before a deferral's move to Redis's clock), or a
    reschedule's add (``held``: whether the push may have left the id waiting in Redis;
    an add that found it there already did not). None: Redis may hold the id at any due
    time, or not at all (a nack that moved nothing, a sweep's move): the row's is pushed.

    Pushes of one job may reach Redis out of the order of their commits: a reschedule
    committed between an attempt's commit and its nack found the id in flight, and its
    add left it alone, so the nack put it back at the old time; two reschedules' pushes
    may cross. So the row is read after each push: the read sees every change committed
    before the push, and one committed after the read pushes after its commit, then reads
    again. The last push to reach Redis is thus followed by a read of the last due time,
    pushed if it differs (by ``add``, which moves a pending id), and read again.
    A cancel committed before the push found the id in flight or not yet added, and its
    removal left it be: a row finished for good (or gone) takes the id out again. Not a
    row running or dead: another worker may have claimed the id since the nack, and by
    the removal have failed that attempt (or the job, dead, been requeued) and put the id
    back in pending for the job's next attempt, which the removal would then strand.
    A row that cannot be read is left to reconcile. Raises only ``EngineUnavailable``.

    By queue name, not the shard nacked (``queue`` may name one): after a change of the
    queue's shard count, a sweep may have moved the id from there to its new shard since
    the nack, and an add there would leave a second copy, a removal a stray one.
    """
    from .models import FOR_GOOD, WAITING, Job

    queue = queue_of(queue)
    while True:
        try:
            row = (
                Job.objects.using(sql.db())  # not a replica: it may not have the commit yet
                .filter(pk=job_id)
                .values_list("status", "run_at", "priority")
                .first()
            )
            run_at_ms = None if row is None or row[1] is None else timing.to_ms(row[1])
        except Exception:  # a poison row or the database down: reconcile repairs Redis
            logger.warning("job %s: could not read it back after its push to Redis; "
                           "reconcile will check Redis", job_id, exc_info=True)  # fmt: skip
            return
        if row is None or row[0] in FOR_GOOD:
            if held:
                engine.remove(queue, [job_id])
            return
        if row[0] not in WAITING or run_at_ms is None or run_at_ms == pushed_ms:
            return  # running (in flight), dead (in garbage), or agreed
        added = engine.add(queue, {job_id: run_at_ms}, {job_id: row[2]} if row[2] else None)
        held, pushed_ms = held or bool(added), run_at_ms


#: The level of each outcome's log line; the rest are DEBUG (``-v 3``).
_LEVELS = {Outcome.RETRYING: logging.INFO, Outcome.SKIPPED: logging.INFO,
           Outcome.DEAD: logging.WARNING}  # fmt: skip


def log_outcome(queue: str, job_id: str, result: Result) -> None:
    """One log line per delivery, with the job's fields for structured logs."""
    level = _LEVELS.get(result.outcome, logging.DEBUG)
    if not logger.isEnabledFor(level):
        return
    # The first line: for a failure, the raised exception's class and message (execution.describe).
    why = one_line(result.error.strip().splitlines()[0]) if result.error.strip() else ""
    fields = job_fields(job_id, queue, result.job, result.outcome.value)
    if why:
        logger.log(level, "job %s: %s (%s)", job_id, result.outcome.value, why, extra=fields)
    else:
        logger.log(level, "job %s: %s", job_id, result.outcome.value, extra=fields)


#: The signal of an outcome that ends a job without success.
ENDED = {Outcome.DEAD: signals.job_dead, Outcome.SKIPPED: signals.job_skipped}


def send_signals(result: Result) -> bool:
    """Send the outcome's signals; True if they had receivers."""
    job = result.job
    if job is None:
        return False
    extra: dict[str, Any] = {"error": result.error}
    if result.outcome == Outcome.SUCCEEDED:
        return signals.send(signals.job_succeeded, job)
    # The action raised (retrying, dead, or skipped: no time left for another attempt), or
    # the job ended without running it (dead, or skipped: expired, its target gone).
    failed = result.failed and signals.send(signals.job_failed, job, **extra)
    ended = ENDED.get(result.outcome)
    return (ended is not None and signals.send(ended, job, **extra)) or failed
