"""Audit of the job signals and the cancel-on-signal helpers, against a real worker."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.db import transaction
from django.dispatch import Signal
from django.test.utils import isolate_apps

from django_delayjobs import cancel_on, schedule, signals
from django_delayjobs.backends import connect_signals
from django_delayjobs.connection import get_engine
from django_delayjobs.models import EventKind, Job, Status
from django_delayjobs.registry import DelayableMethod
from django_delayjobs.services import cancel
from tests.testapp import tasks
from tests.testapp.models import LoudThing, Thing

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def thing() -> Thing:
    return Thing.objects.create(name="t")


def burst() -> None:
    call_command("run_delayworker", "--burst", "-v", "0")


@pytest.fixture
def without_task_receivers() -> Iterator[None]:
    """As in a project that does not use the Tasks backend: its receivers (of any sender)
    are not connected."""
    try:
        assert signals.job_started.disconnect(dispatch_uid="delayjobs-tasks-started")
        assert signals.job_succeeded.disconnect(dispatch_uid="delayjobs-tasks-succeeded")
        yield
    finally:
        connect_signals()


@pytest.mark.parametrize("name", ["job_started", "job_succeeded"])
def test_a_receiver_connected_for_sender_job_gets_the_worker_signals(without_task_receivers, name):
    """Every signal is sent with sender=Job, so a receiver connected with sender=Job (as
    Django's docs show for model signals) must get it. The worker sent job_started only
    when job_started.has_listeners() said so, which asks for receivers of any sender: one
    connected for Job alone never got job_started."""
    got: list[tuple[Any, str, str]] = []

    def receiver(sender: Any, job: Job, **kwargs: Any) -> None:
        got.append((sender, str(job.pk), job.status))

    signal = getattr(signals, name)
    signal.connect(receiver, sender=Job)
    try:
        job = schedule(tasks.record, in_=0, args=["ran"])
        burst()
    finally:
        signal.disconnect(receiver, sender=Job)
    status = Status.RUNNING if name == "job_started" else Status.SUCCEEDED
    assert got == [(Job, str(job.pk), status)]


def test_cancel_on_for_two_methods_of_the_same_qualified_name_connects_both(monkeypatch):
    """cancel_on keyed its receivers by repr(action), "<delayable method Thing.touch>" for
    every model class named Thing, whatever its module: a second model of that name (a
    child or proxy in another app) got the first one's receiver back, its own never
    connected, and its jobs were never cancelled by the signal."""

    def touch(self: LoudThing) -> None:
        pass

    touch.__qualname__ = "Thing.touch"  # as a class named Thing in another module
    other = DelayableMethod(touch)
    monkeypatch.setattr(LoudThing, "touch", other, raising=False)
    other.__set_name__(LoudThing, "touch")
    assert repr(other) == repr(Thing.touch)
    paid = Signal()
    first = cancel_on(paid, Thing.touch, sender=Thing, name="paid")
    second = cancel_on(paid, LoudThing.touch, sender=Thing, name="paid")
    assert second is not first
    assert cancel_on(paid, LoudThing.touch, sender=Thing, name="paid") is second  # ready() twice
    assert len(paid.receivers) == 2


def test_cancel_on_finds_the_instance_sent_as_the_sender(thing):
    """A signal sent as Django's own idiom has it, ``order_paid.send(sender=order)``, gives
    the receiver the object as its sender argument, never among the keywords: with
    instance_kwarg="sender" each payment failed with "the signal was sent without
    sender=", rolled back; "signal" (Django's own keyword, the Signal) failed each one
    with cancel_for's TypeError. The first finds the object (sender= would never match it,
    so it is refused with one), the second is refused when connecting."""
    paid = Signal()
    with pytest.raises(TypeError, match="signal"):
        cancel_on(paid, Thing.expire, instance_kwarg="signal")
    with pytest.raises(TypeError, match="no sender="):  # Thing would never be the object
        cancel_on(paid, Thing.expire, sender=Thing, instance_kwarg="sender")
    assert not paid.receivers
    cancel_on(paid, Thing.expire, instance_kwarg="sender", name="paid")
    job = schedule(thing.expire, in_=60)
    with transaction.atomic():
        paid.send(sender=thing)
    job.refresh_from_db()
    assert job.status == Status.CANCELLED
    assert job.events.get(kind=EventKind.CANCELLED).actor == "signal:paid"


@pytest.mark.parametrize("outer", [False, True], ids=["autocommit", "in-a-transaction"])
def test_a_job_scheduled_receiver_that_cancels_the_job_leaves_no_id_in_redis(redis_client, outer):
    """schedule() sent job_scheduled before it pushed the job to Redis (schedule_many the
    other way round): a receiver that cancelled the job (a rule that refuses it) removed
    an id not there yet, and the push then added it. The row cancelled, its id sat in
    Redis until due, counted as pending."""
    cancelled: list[bool] = []

    def refuse(sender: Any, job: Job, **kwargs: Any) -> None:
        cancelled.append(cancel(job))

    signals.job_scheduled.connect(refuse)
    try:
        with transaction.atomic() if outer else contextlib.nullcontext():
            job = schedule(tasks.record, in_=60, args=["refused"])
    finally:
        signals.job_scheduled.disconnect(refuse)
    assert cancelled == [True]
    assert Job.objects.get(pk=job.pk).status == Status.CANCELLED
    assert get_engine().stats("default").pending == 0


@isolate_apps("django_delayjobs")
def test_a_job_given_as_a_proxy_of_job_is_still_sent_with_sender_job(thing):
    """Every signal is sent with sender=Job, and receivers connect for it: cancel() given
    a job read through a proxy of Job (an admin's "dead jobs" model) sent job_cancelled
    with the proxy as its sender (type(job)), which receivers of Job never got."""

    class DeadJob(Job):
        class Meta:
            proxy = True
            app_label = "django_delayjobs"

    got: list[Any] = []

    def receiver(sender: Any, job: Job, **kwargs: Any) -> None:
        got.append((sender, job.pk))

    job = schedule(thing.touch, in_=60)
    signals.job_cancelled.connect(receiver, sender=Job)
    try:
        assert cancel(DeadJob.objects.get(pk=job.pk))
    finally:
        signals.job_cancelled.disconnect(receiver, sender=Job)
    assert got == [(Job, job.pk)]
