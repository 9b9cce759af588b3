"""Audit: a requeued task sent no ``task_enqueued``, though it goes back to READY and
starts and finishes again."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone

from django_delayjobs.backends import DelayJobsBackend, TaskResultStatus
from django_delayjobs.models import Job, Status
from django_delayjobs.services import requeue, schedule
from tests.testapp import task_functions as t
from tests.testapp import tasks

try:
    from django.tasks import signals as task_signals
except ImportError:
    from django_tasks import signals as task_signals

pytestmark = pytest.mark.django_db(transaction=True)


def burst() -> None:
    call_command("run_delayworker", "--burst", "--queues", "default,other", "-v", "0")


class Seen:
    """The framework's signals received, as (name, sender, status, id)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Any, str, str]] = []
        self.receivers = {name: self.on(name) for name in
                          ("task_enqueued", "task_started", "task_finished")}  # fmt: skip

    def on(self, name: str) -> Any:
        def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
            self.seen.append((name, sender, str(task_result.status), task_result.id))

        return receiver

    def __enter__(self) -> Seen:
        for name, receiver in self.receivers.items():
            getattr(task_signals, name).connect(receiver)
        return self

    def __exit__(self, *exc: object) -> None:
        for name, receiver in self.receivers.items():
            getattr(task_signals, name).disconnect(receiver)


def dead_task() -> str:
    result = t.explode.enqueue("bad input")
    burst()
    assert Job.objects.get(pk=result.id).status == Status.DEAD
    return result.id


def test_a_requeued_task_is_enqueued_again_then_starts_and_finishes_again():
    job_id = dead_task()
    with Seen() as s:
        assert requeue(job_id, actor="admin:1")
        assert s.seen == [("task_enqueued", DelayJobsBackend, "READY", job_id)]
        burst()
    assert [name for name, *_ in s.seen] == ["task_enqueued", "task_started", "task_finished"]
    assert s.seen[-1][2] == TaskResultStatus.FAILED


def test_job_requeue_sends_it_too_after_the_commit():
    job_id = dead_task()
    with Seen() as s:
        with transaction.atomic():
            assert Job.objects.get(pk=job_id).requeue()
            assert s.seen == []  # not before the requeue commits
        assert [name for name, *_ in s.seen] == ["task_enqueued"]


def test_a_requeue_not_won_or_refused_sends_nothing():
    job_id = dead_task()
    assert requeue(job_id)
    with Seen() as s:
        assert not requeue(job_id)  # not dead any more: nothing requeued
    assert s.seen == []


def test_a_raising_receiver_of_a_requeue_is_logged_not_raised(caplog):
    job_id = dead_task()

    def boom(**kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    task_signals.task_enqueued.connect(boom)
    try:
        assert requeue(job_id)
    finally:
        task_signals.task_enqueued.disconnect(boom)
    assert "receiver bug" in caplog.text
    assert Job.objects.get(pk=job_id).status == Status.SCHEDULED


def test_a_plain_job_requeued_sends_no_task_signal():
    job = schedule(tasks.fail, at=timezone.now(), max_attempts=1)
    burst()
    assert Job.objects.get(pk=job.pk).status == Status.DEAD
    with Seen() as s:
        assert requeue(job.pk)
    assert s.seen == []
