"""Audit of the django.tasks backend and of the services' job references."""

from __future__ import annotations

import logging
import uuid

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import transaction

from django_delayjobs import services
from django_delayjobs.backends import TaskResultStatus
from django_delayjobs.connection import get_engine
from django_delayjobs.models import Job
from tests.testapp import task_functions as t

try:
    from django.tasks import default_task_backend
    from django.tasks import signals as task_signals
except ImportError:
    from django_tasks import default_task_backend
    from django_tasks import signals as task_signals

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _clean_redis(redis_client):
    pass


def burst() -> None:
    call_command("run_delayworker", "--burst", "--queues", "default,other", "-v", "0")


def held() -> int:
    """How many ids Redis holds for the default queue, waiting or ready."""
    stats = get_engine().stats("default")
    return stats.pending + stats.ready


def _raise(sender, task_result, **kwargs):
    raise RuntimeError(f"receiver failed for {task_result.id}")


def test_a_task_enqueued_receiver_that_raises_skips_no_hook_of_the_transaction(caplog):
    """The signal follows the commit: a receiver raising there reached the caller as the
    atomic block's exit (the rows committed), and Django dropped the transaction's later
    hooks: the next job's hand-over to Redis (until reconcile) and the caller's own."""
    hooks: list[str] = []
    task_signals.task_enqueued.connect(_raise)
    try:
        with caplog.at_level(logging.ERROR), transaction.atomic():
            first = t.add.enqueue(1, 2)
            second = t.add.enqueue(3, 4)
            transaction.on_commit(lambda: hooks.append("caller's hook"))
    finally:
        task_signals.task_enqueued.disconnect(_raise)
    assert hooks == ["caller's hook"]
    assert held() == 2 and Job.objects.filter(pk__in=[first.id, second.id]).count() == 2
    assert f"receiver failed for {second.id}" in caplog.text


def test_a_task_enqueued_receiver_that_raises_outside_a_transaction(caplog):
    """The same without a transaction: enqueue returns the result of the job it wrote
    (a caller told it failed would enqueue the task again), the receiver's error logged,
    and the receivers after it are still called."""
    seen: list[str] = []

    def after(sender, task_result, **kwargs):
        seen.append(task_result.id)

    task_signals.task_enqueued.connect(_raise)
    task_signals.task_enqueued.connect(after)
    try:
        with caplog.at_level(logging.ERROR):
            result = t.add.enqueue(1, 2)
    finally:
        task_signals.task_enqueued.disconnect(_raise)
        task_signals.task_enqueued.disconnect(after)
    assert seen == [result.id]
    assert held() == 1
    assert f"receiver failed for {result.id}" in caplog.text
    burst()
    assert default_task_backend.get_result(result.id).status == TaskResultStatus.SUCCESSFUL


def test_a_task_started_or_finished_receiver_that_raises_stops_no_other_receiver(caplog):
    seen: list[str] = []

    def after(sender, task_result, **kwargs):
        seen.append(str(task_result.status))

    for signal in (task_signals.task_started, task_signals.task_finished):
        signal.connect(_raise)
        signal.connect(after)
    try:
        with caplog.at_level(logging.ERROR):
            result = t.add.enqueue(1, 2)
            burst()
    finally:
        for signal in (task_signals.task_started, task_signals.task_finished):
            signal.disconnect(_raise)
            signal.disconnect(after)
    assert seen == ["RUNNING", "SUCCESSFUL"]
    assert default_task_backend.get_result(result.id).status == TaskResultStatus.SUCCESSFUL


MALFORMED = ["not-a-uuid", b"0" * 32, 1.5, [1], "", "\x00", -1, 2**200, None, True]
MISSING = [uuid.uuid4(), str(uuid.uuid4()).upper(), 42]


@pytest.mark.parametrize("verb", ["cancel", "reschedule", "requeue", "purge"])
def test_services_refuse_a_malformed_job_id_with_validation_error(verb):
    call = {"reschedule": lambda ref: services.reschedule(ref, in_=60)}.get(
        verb, getattr(services, verb)
    )
    for ref in MALFORMED:
        with pytest.raises(ValidationError):
            call(ref)
    for ref in MISSING:
        with pytest.raises(Job.DoesNotExist):
            call(ref)
