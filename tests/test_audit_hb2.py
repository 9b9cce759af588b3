"""Audit of the hand-back's undo of unstarted claims (second round).

1. The claim was undone whenever the action had not been called, but ``job_started``'s
   receivers, ``resolve()`` and the arguments run before that: a receiver that hangs
   stopped every worker past MAX_RUN_SECONDS, each stop undid the claim, and the job was
   never counted as delivered, never ``dead``: a crash loop across every worker. Only a
   claim the worker had not kept yet (right after it commits) may be undone.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from django_delayjobs import schedule, signals
from django_delayjobs.connection import get_engine
from django_delayjobs.models import Job, Status
from django_delayjobs.preflight import check_owner
from django_delayjobs.worker import Options, WorkerDied, WorkerProcess
from tests.helpers import wait_for
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)
Q = "default"


@pytest.fixture
def hanging_start() -> Iterator[threading.Event]:
    """A ``job_started`` receiver that holds its worker thread until the test ends."""
    release = threading.Event()

    def hang(sender: object, **kwargs: object) -> None:
        release.wait(60)

    signals.job_started.connect(hang, weak=False)
    try:
        yield release
    finally:
        release.set()
        signals.job_started.disconnect(hang)


def test_a_job_whose_started_receiver_hangs_ends_dead_after_max_deliveries(settings, hanging_start):
    """Each worker that claims it stops past MAX_RUN_SECONDS and hands its id back: the
    claim is kept (its receivers ran), so each stop uses a delivery, and after
    ``MAX_DELIVERIES`` of them the job is ``dead``, naming the cause, instead of
    stopping every worker that takes it, for ever."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "MAX_RUN_SECONDS": 1, "LEASE_SECONDS": 1,
                          "SHUTDOWN_GRACE_SECONDS": 0, "MAX_DELIVERIES": 2}  # fmt: skip
    job = schedule(tasks.record, in_=0, args=["ran"])
    check_owner(get_engine())  # as run_delayworker does before its threads start
    processes: list[WorkerProcess] = []
    stops = 0

    def dead() -> bool:
        nonlocal stops
        process = WorkerProcess(get_engine(), Options(queues=[Q], burst=True))
        processes.append(process)
        try:
            process.run()
        except WorkerDied:
            stops += 1
        return Job.objects.get(pk=job.pk).status == Status.DEAD

    try:
        wait_for(dead, timeout=30, every=0.2)
    finally:
        hanging_start.set()
        for process in processes:
            for thread in process.threads:
                thread.join(10)
    job.refresh_from_db()
    assert (job.attempts, job.deliveries, stops) == (1, 2, 2)
    assert "stopped when the action ran past MAX_RUN_SECONDS" in job.last_error
    kinds = list(job.events.order_by("id").values_list("kind", flat=True))
    assert kinds == ["scheduled", "started", "started", "dead"]
