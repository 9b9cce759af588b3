"""Audit of the job signals and the cancel-on-signal helpers, against a real worker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command

from django_delayjobs import schedule, signals
from django_delayjobs.backends import connect_signals
from django_delayjobs.models import Job, Status
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def burst() -> None:
    call_command("run_delayworker", "--burst", "-v", "0")


@pytest.fixture
def without_task_receivers() -> Iterator[None]:
    """As in a project that does not use the Tasks backend: its receivers (of any sender)
    are not connected."""
    assert signals.job_started.disconnect(dispatch_uid="delayjobs-tasks-started")
    assert signals.job_succeeded.disconnect(dispatch_uid="delayjobs-tasks-succeeded")
    try:
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
