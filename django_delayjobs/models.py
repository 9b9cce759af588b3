"""The audit trail: ``Job`` (current state, the judge of every run) and ``JobEvent``."""

from __future__ import annotations

import os
import time
import uuid
from typing import Any, TypeVar

from django.contrib.contenttypes.fields import GenericForeignKey
from django.contrib.contenttypes.models import ContentType
from django.db import models, router
from django.utils import timezone

from .registry import ACTION_MAX_LENGTH


class Status(models.TextChoices):
    SCHEDULED = "scheduled"
    RUNNING = "running"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    CANCELLED = "cancelled"
    DEAD = "dead"
    SKIPPED = "skipped"


#: A job in one of these may still run; at most one per (queue, key).
ACTIVE = (Status.SCHEDULED, Status.RUNNING, Status.RETRYING)
#: A job in one of these has not started its current attempt: cancel and reschedule win.
WAITING = (Status.SCHEDULED, Status.RETRYING)
FINISHED = (Status.SUCCEEDED, Status.CANCELLED, Status.DEAD, Status.SKIPPED)
#: Finished for good: unlike a dead job (requeued, it waits again) or a running one (its
#: attempt may fail, and it waits for the next), none of these ever waits again, so a
#: removal of its id from Redis can race no revival.
FOR_GOOD = (Status.SUCCEEDED, Status.CANCELLED, Status.SKIPPED)


def time_ordered_uuid() -> uuid.UUID:
    """A UUID of version 7 (RFC 9562): 48 bits of Unix time in ms, then 74 random bits.

    Ids made later sort later, so a new job's row and its events land at the end of the
    primary key's index and of the events' ``(job, at)`` index, not on a random page of
    each: once the tables are large, the jobs of a second touch a few pages of them, not
    thousands (docs/performance.md). 74 random bits keep an id unguessable.
    """
    ms = time.time_ns() // 1_000_000 & (1 << 48) - 1
    rand = int.from_bytes(os.urandom(10), "big")  # 80 bits: 12 for rand_a, 62 for rand_b
    rand_a, rand_b = rand >> 68, rand & (1 << 62) - 1
    return uuid.UUID(int=ms << 80 | 0x7 << 76 | rand_a << 64 | 0b10 << 62 | rand_b)


_M = TypeVar("_M", bound=models.Model)


class OnWriteDatabase(models.Manager[_M]):
    """Reads from the database that writes go to (``router.db_for_write``), unless told
    another (``using``, ``db_manager``). A router that sends reads to a replica, as in
    Django's documented primary/replica pattern, would have the key check, ``cancel_for``
    and ``requeue`` miss a job written a moment ago: these rows are read to be changed."""

    @property
    def db(self) -> str:
        hints = self._hints  # type: ignore[attr-defined]  # a related manager's instance
        return self._db or router.db_for_write(self.model, **hints)

    def get_queryset(self) -> models.QuerySet[_M]:
        return super().get_queryset().using(self.db)


class Job(models.Model):
    """One delayed action: what to run, when, and what happened so far."""

    id = models.UUIDField(primary_key=True, default=time_ordered_uuid, editable=False)
    queue = models.CharField(max_length=64)
    action = models.CharField(
        max_length=ACTION_MAX_LENGTH, help_text="Registered name of the action."
    )
    # No index of its own: the (target_type, target_id) index below serves it as well.
    target_type = models.ForeignKey(
        ContentType, null=True, blank=True, on_delete=models.PROTECT, related_name="+",
        db_index=False,
    )  # fmt: skip
    target_id = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    target = GenericForeignKey("target_type", "target_id")
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    # NULL, not "": the partial unique constraint below must ignore key-less jobs.
    key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    run_at = models.DateTimeField(help_text="When the job is (next) due.")
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Never start after this.")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.SCHEDULED)
    # (attempts, deliveries) is the fencing token: an outcome is only written by the worker
    # holding the row's current delivery of its current attempt. Both only grow (deliveries
    # restarts at 1 with each new attempt), so a pair is never reused.
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=5)
    deliveries = models.PositiveIntegerField(
        default=0,
        help_text="Times the current attempt was handed to a worker. More than one: an "
        "earlier delivery never recorded an outcome (its worker was lost), so the same "
        "attempt ran again without being counted twice.",
    )
    priority = models.SmallIntegerField(
        default=0, help_text="-100 to 100: among due jobs of a queue, higher starts first."
    )
    worker = models.CharField(max_length=128, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    result = models.JSONField(
        null=True, blank=True, help_text="The action's return value, if JSON."
    )

    objects = OnWriteDatabase["Job"]()

    class Meta:
        base_manager_name = "objects"  # so that refresh_from_db() and event.job read there too
        ordering = ["-run_at"]
        indexes = [
            # reconcile: active jobs due before a horizon; admin: filter by status
            models.Index(fields=["status", "run_at"], name="delayjobs_status_run_at"),
            # cancel_for(obj)
            models.Index(fields=["target_type", "target_id"], name="delayjobs_target"),
            models.Index(fields=["queue", "status"], name="delayjobs_queue_status"),
            models.Index(fields=["run_at"], name="delayjobs_run_at"),
            # delayjobs_prune: finished jobs, oldest finish first
            models.Index(
                fields=["finished_at"],
                name="delayjobs_finished_at",
                condition=models.Q(status__in=FINISHED),
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["queue", "key"],
                condition=models.Q(status__in=ACTIVE, key__isnull=False),
                name="delayjobs_one_active_job_per_key",
            ),
            models.CheckConstraint(
                condition=models.Q(max_attempts__gte=1), name="delayjobs_max_attempts_gte_1"
            ),
            models.CheckConstraint(
                condition=models.Q(priority__gte=-100, priority__lte=100),
                name="delayjobs_priority_range",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.action} ({self.status}, {self.id})"

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE

    def cancel(self, *, actor: str = "code") -> bool:
        """Cancel the job if it has not started; True when this call won."""
        from .services import cancel

        return cancel(self, actor=actor)

    def reschedule(self, *, in_: Any = None, at: Any = None, actor: str = "code") -> bool:
        """Move the job to a new due time if it has not started; True when this call won."""
        from .services import reschedule

        return reschedule(self, in_=in_, at=at, actor=actor)

    def requeue(self, *, actor: str = "code") -> bool:
        """Give a dead job another set of attempts, due now; True when this call won."""
        from .services import requeue

        return requeue(self, actor=actor)


class Deployment(models.Model):
    """The one row naming this database's deployment; Redis keeps a copy under ``PREFIX``.

    Two deployments (two databases) whose workers share a Redis database and ``PREFIX``
    would take each other's ids and find no row for them; a worker compares the two
    names at start-up and refuses to run beside another deployment's jobs.
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1, editable=False)
    uid = models.UUIDField(default=uuid.uuid4, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    objects = OnWriteDatabase["Deployment"]()

    def __str__(self) -> str:
        return str(self.uid)


class EventKind(models.TextChoices):
    SCHEDULED = "scheduled"
    RESCHEDULED = "rescheduled"
    CANCELLED = "cancelled"
    STARTED = "started"
    FAILED = "failed"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    SKIPPED = "skipped"
    REQUEUED = "requeued"
    HANDED_BACK = "handed_back"


class JobEvent(models.Model):
    """One thing that happened to a job. Append-only; written with the change it records."""

    # No index of its own: the (job, at) index below serves lookups by job.
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events", db_index=False)
    kind = models.CharField(max_length=16, choices=EventKind.choices)
    at = models.DateTimeField(default=timezone.now)
    attempt = models.PositiveIntegerField(default=0)
    actor = models.CharField(
        max_length=150, blank=True, default="",
        help_text="Who caused it: code, signal:<name>, admin:<user>, api:<user>, worker:<id>.",
    )  # fmt: skip
    message = models.TextField(blank=True, default="")

    objects = OnWriteDatabase["JobEvent"]()

    class Meta:
        # The order the changes were committed in, not ``at``: each event is written in
        # the transaction of the change it records, after that change's UPDATE (or INSERT)
        # of the job's row, whose lock orders them, so a later one gets a higher id. ``at``
        # is its writer's clock, and a worker's host may be seconds ahead of a web host's:
        # by ``at``, a dead job requeued a moment after it died showed the requeue first.
        ordering = ["id"]
        indexes = [models.Index(fields=["job", "at"], name="delayjobs_event_job_at")]

    def __str__(self) -> str:
        return f"{self.kind} at {self.at:%Y-%m-%d %H:%M:%S}"
