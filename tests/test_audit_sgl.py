"""Audit sgl: a job that ends is heard of. A job settled ``skipped`` sent no signal at
all, so a ``django.tasks`` task whose job was skipped never got ``task_finished``; a
poison row buried dead sends ``job_dead`` (and ``task_finished`` for a task) with what
can be read of it. A real worker (``run_delayworker --burst``), a real Redis."""

from __future__ import annotations

import datetime
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_delayjobs import outcomes, schedule, signals
from django_delayjobs.backends import TaskFailed, TaskResultStatus
from django_delayjobs.models import Job, Status
from tests.testapp import task_functions as t
from tests.testapp import tasks
from tests.testapp.models import Thing

from .test_poison import plant

try:
    from django.tasks import signals as task_signals
except ImportError:
    from django_tasks import signals as task_signals

pytestmark = pytest.mark.django_db(transaction=True)


def burst() -> None:
    call_command("run_delayworker", "--burst", "--queues", "default,other", "-v", "0")


@contextmanager
def heard(*names: str) -> Iterator[list[tuple[str, Any, dict[str, Any]]]]:
    """What the named signals (of ``signals``, or ``task_finished``) send meanwhile."""
    got: list[tuple[str, Any, dict[str, Any]]] = []
    receivers = {}
    for name in names:
        signal = getattr(signals, name, None) or getattr(task_signals, name)

        def receiver(sender: Any, name: str = name, **kwargs: Any) -> None:
            kwargs.pop("signal")
            if name == "task_finished":
                kwargs["exc_info"] = sys.exc_info()[0]
            got.append((name, sender, kwargs))

        signal.connect(receiver)
        receivers[signal] = receiver
    try:
        yield got
    finally:
        for signal, receiver in receivers.items():
            signal.disconnect(receiver)


def test_a_job_skipped_because_its_target_is_gone_sends_job_skipped():
    thing = Thing.objects.create(name="gone")
    job = schedule(thing.touch, in_=0)
    thing.delete()
    with heard("job_skipped", "job_failed", "job_dead") as got:
        burst()
    [(name, sender, kwargs)] = got
    assert (name, sender, kwargs["job"].pk, kwargs["job"].status) == (
        "job_skipped", Job, job.pk, Status.SKIPPED
    )  # fmt: skip
    assert kwargs["error"] == "the target object no longer exists" == kwargs["job"].last_error


def expire(job_id: str, at: datetime.datetime, **values: Any) -> None:
    """Give a task's job an expiry (the backend sets none; a project may, by hand)."""
    assert Job.objects.filter(pk=job_id).update(expires_at=at, **values) == 1


def test_an_expired_task_sends_task_finished_once_failed():
    result = t.add.enqueue(1, 2)
    expire(result.id, timezone.now() - datetime.timedelta(seconds=1))
    with heard("job_skipped", "task_finished") as got:
        burst()
    assert sorted(name for name, _, _ in got) == ["job_skipped", "task_finished"]
    [finished] = [kwargs["task_result"] for name, _, kwargs in got if name == "task_finished"]
    assert (finished.id, finished.status) == (result.id, TaskResultStatus.FAILED)
    assert "expired at" in finished.errors[-1].traceback


def test_a_task_whose_retry_would_be_past_its_expiry_sends_task_finished_once_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its failure sends job_failed, then its skip job_skipped; task_finished once, while
    the task's failure is handled (as for a task that died)."""
    monkeypatch.setattr(outcomes, "backoff_seconds", lambda attempt: 3600.0)  # past expires
    result = t.explode.enqueue("boom")
    expire(result.id, timezone.now() + datetime.timedelta(minutes=10), max_attempts=3)
    with heard("job_failed", "job_skipped", "job_dead", "task_finished") as got:
        burst()
    sent = {name: kwargs for name, _, kwargs in got}
    assert [name for name, _, _ in got].count("task_finished") == 1
    assert sorted(sent) == ["job_failed", "job_skipped", "task_finished"]
    names = [name for name, _, _ in got]
    assert names.index("job_failed") < names.index("job_skipped")
    assert Job.objects.get(pk=result.id).status == Status.SKIPPED
    assert sent["task_finished"]["task_result"].status == TaskResultStatus.FAILED
    assert sent["task_finished"]["exc_info"] is TaskFailed
    assert "ValueError: boom" in sent["job_skipped"]["error"]


def test_a_poison_row_buried_dead_sends_job_dead_with_what_can_be_read():
    """The receivers get the job's id, queue, action and the outcome (status,
    finished_at, last_error) without reading the row again; one that raises changes
    nothing for the bury or for the receivers after it."""
    job = schedule(tasks.record, in_=0, args=["poison"])
    plant(job, "kwargs 5000-digit int")
    read: list[tuple[Any, ...]] = []

    def failing(sender: Any, job: Job, **kwargs: Any) -> None:
        raise RuntimeError("a receiver that fails")

    def reading(sender: Any, job: Job, error: str, **kwargs: Any) -> None:
        with CaptureQueriesContext(connection) as queries:
            seen = (job.pk, job.queue, job.action, job.status, job.last_error,
                    job.finished_at is not None, error)  # fmt: skip
        read.append((*seen, len(queries.captured_queries)))

    signals.job_dead.connect(failing)
    signals.job_dead.connect(reading)
    try:
        burst()
    finally:
        signals.job_dead.disconnect(failing)
        signals.job_dead.disconnect(reading)
    [(pk, queue, action, status, last_error, finished, error, queries)] = read
    assert (pk, queue, action, status, finished) == (job.pk, job.queue, job.action, "dead", True)
    assert queries == 0
    assert last_error == error and "cannot be read back" in error
    assert Job.objects.filter(pk=job.pk).values_list("status", flat=True).get() == Status.DEAD


def test_a_poison_task_buried_dead_sends_task_finished_once_failed():
    result = t.add.enqueue(1, 2)
    plant(Job.objects.get(pk=result.id), "kwargs 5000-digit int")
    with heard("job_dead", "task_finished") as got:
        burst()
    assert sorted(name for name, _, _ in got) == ["job_dead", "task_finished"]
    [finished] = [kwargs["task_result"] for name, _, kwargs in got if name == "task_finished"]
    assert finished.status == TaskResultStatus.FAILED
