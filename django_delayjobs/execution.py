"""Running one claimed job: claim the row, run the action, record the outcome, ack.

The database decides. The claim is a conditional UPDATE; the action runs inside
``transaction.atomic()`` whose last statement is the ``succeeded`` UPDATE fenced by the
attempt number, so a worker that was overtaken (its lease expired and another worker
claimed the row) cannot commit a second outcome: its effects roll back.
"""

from __future__ import annotations

import logging
import random
import time
import traceback
from collections.abc import Callable
from contextvars import ContextVar
from datetime import timedelta
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.utils import timezone

from . import serialization, signals, sql, timing
from .conf import delayjobs_settings
from .engine import Engine
from .exceptions import UnknownAction
from .models import ACTIVE, EventKind, Job, Status
from .registry import resolve

logger = logging.getLogger("django_delayjobs.worker")

#: The job whose action is running in this thread (for actions that want their attempt).
current_job: ContextVar[Job | None] = ContextVar("current_job", default=None)

#: A job promoted this close to its due time (Redis and this host's clocks may differ by
#: a little, and due times are whole ms) waits here instead of going back to Redis.
EARLY_WAIT = timedelta(seconds=1)


class LeaseLost(Exception):
    """The row's attempt is no longer ours: another worker took the job over."""


def backoff_seconds(attempt: int) -> float:
    """Return the delay before retry number ``attempt``: exponential, capped, jittered."""
    base = delayjobs_settings.RETRY_BACKOFF_SECONDS * 2 ** min(attempt - 1, 30)
    capped = min(float(base), float(delayjobs_settings.RETRY_BACKOFF_MAX_SECONDS))
    return capped * random.uniform(0.5, 1.0)


class Execution:
    """Everything that happens to one id a worker took from Redis."""

    def __init__(
        self,
        engine: Engine,
        queue: str,
        job_id: str,
        worker_id: str,
        ack: Callable[[str], None] | None = None,
    ) -> None:
        self.engine = engine
        self.queue = queue
        self.job_id = job_id
        self.worker_id = worker_id
        self.actor = f"worker:{worker_id}"
        self.job: Job | None = None
        # Acking late is safe (a redelivered id finds its row finished and is acked
        # then), so a worker may collect acks and send them in one call.
        self._ack = ack or (lambda job_id: self.engine.ack(self.queue, [job_id]))

    def run(self) -> str:
        """Process the job; return what happened (an outcome name, for stats and logs)."""
        job = self.claim()
        if job is None:
            return "dropped"
        self.job = job
        signals.send(signals.job_started, job)
        if job.expires_at is not None and timezone.now() > job.expires_at:
            return self.finish(Status.SKIPPED, f"expired at {job.expires_at.isoformat()}")
        try:
            fn = self.resolve(job)
        except UnknownAction as exc:
            return self.finish(Status.DEAD, str(exc))
        if fn is None:
            return self.finish(Status.SKIPPED, "the target object no longer exists")
        return self.execute(fn)

    # -- steps -----------------------------------------------------------------

    def claim(self) -> Job | None:
        """Claim the row for a new attempt, or settle the id in Redis and return None."""
        with transaction.atomic(using=sql.db()):
            job = sql.claim(self.job_id, self.worker_id, timezone.now())
            if job is not None:
                self.event(job, EventKind.STARTED, f"attempt {job.attempts} of {job.max_attempts}")
                return job
        return self.settle()

    def settle(self) -> Job | None:
        """The claim found nothing to start: say why to Redis (and retry if just early)."""
        job = sql.fetch(self.job_id)
        if job is None or job.status not in ACTIVE:
            self._ack(self.job_id)  # cancelled, finished or deleted
            return None
        early = (job.run_at - timezone.now()).total_seconds()
        if early > EARLY_WAIT.total_seconds():  # rescheduled after Redis promoted it
            self.engine.nack(self.queue, {self.job_id: timing.to_ms(job.run_at)})
            return None
        if early > 0:  # this host's clock is behind Redis's: never start before run_at
            time.sleep(early)
            return self.claim()
        if job.attempts >= job.max_attempts:
            self.give_up(job)
            return None
        # Changed between our UPDATE and SELECT (a cancel, say): look at it again shortly.
        self.engine.nack(self.queue, {self.job_id: self.engine.server_time_ms()})
        return None

    def give_up(self, job: Job) -> None:
        """The last attempt started and never recorded an outcome: its worker was lost."""
        message = f"attempt {job.attempts} of {job.max_attempts} never finished (worker lost)"
        with transaction.atomic(using=sql.db()):
            won = Job.objects.filter(pk=job.pk, status__in=ACTIVE, attempts=job.attempts).update(
                status=Status.DEAD, finished_at=timezone.now(), last_error=message
            )
            if won:
                self.event(job, EventKind.DEAD, message)
        if won:
            self.engine.bury(self.queue, [self.job_id])
            signals.send(signals.job_dead, job, error=message)

    def resolve(self, job: Job) -> Callable[..., Any] | None:
        """Return the callable to run; None if its target row is gone."""
        target = None
        if job.target_type_id is not None:
            model = ContentType.objects.get_for_id(job.target_type_id).model_class()
            if model is None:
                raise UnknownAction(f"the model of {job.action!r} is not installed")
            target = model._base_manager.filter(pk=job.target_id).first()
            if target is None:
                return None
        return resolve(job.action, target)

    def execute(self, fn: Callable[..., Any]) -> str:
        job = self.job
        assert job is not None
        try:
            args, kwargs = serialization.load(job.args), serialization.load(job.kwargs)
            with transaction.atomic(using=sql.db()):
                token = current_job.set(job)
                try:
                    result = fn(*args, **kwargs)
                finally:
                    current_job.reset(token)
                try:
                    stored = serialization.dump(result, "result")
                except TypeError:
                    stored = None  # a result that is not JSON is not kept
                self.event(job, EventKind.SUCCEEDED)
                # Last statement of the transaction: the outcome, fenced by our attempt.
                done = {"status": Status.SUCCEEDED, "finished_at": timezone.now(), "result": stored}
                if not sql.update_fenced(job, done):
                    raise LeaseLost
        except LeaseLost:
            logger.warning("job %s attempt %s was taken over; rolled back", job.pk, job.attempts)
            return "overtaken"
        except Exception as exc:  # the action failed: its effects are rolled back
            return self.failed(exc)
        job.status, job.result = Status.SUCCEEDED, stored
        self._ack(self.job_id)
        signals.send(signals.job_succeeded, job)
        return Status.SUCCEEDED

    def failed(self, exc: BaseException) -> str:
        job = self.job
        assert job is not None
        error = "".join(traceback.format_exception(exc))
        if job.attempts >= job.max_attempts:
            return self.finish(Status.DEAD, error, failed=True)
        run_at = timezone.now() + timedelta(seconds=backoff_seconds(job.attempts))
        with transaction.atomic(using=sql.db()):
            retry = {"status": Status.RETRYING, "run_at": run_at, "last_error": error}
            won = sql.update_fenced(job, retry)
            if won:
                self.event(job, EventKind.FAILED, error)
        if not won:
            return "overtaken"
        self.engine.nack(self.queue, {self.job_id: timing.to_ms(run_at)})
        signals.send(signals.job_failed, job, error=error)
        return "retrying"

    def finish(self, status: Status, message: str, failed: bool = False) -> str:
        """Record a final outcome other than success (skipped or dead) and settle Redis."""
        job = self.job
        assert job is not None
        with transaction.atomic(using=sql.db()):
            final = {"status": status, "finished_at": timezone.now(), "last_error": message}
            won = sql.update_fenced(job, final)
            if won:
                if failed:
                    self.event(job, EventKind.FAILED, message)
                self.event(job, EventKind(status.value), message if not failed else "")
        if not won:
            return "overtaken"
        job.status = status
        if status == Status.DEAD:
            self.engine.bury(self.queue, [self.job_id])
            if failed:
                signals.send(signals.job_failed, job, error=message)
            signals.send(signals.job_dead, job, error=message)
        else:
            self._ack(self.job_id)
        return status.value

    # -- helpers ---------------------------------------------------------------

    def event(self, job: Job, kind: str, message: str = "") -> None:
        sql.insert_event(job, kind, self.actor, message)
