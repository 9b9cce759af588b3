"""Audit (chaos): failing tests for the worker under hostile actions."""

from __future__ import annotations

import threading
import time

import pytest

from django_delayjobs import schedule, signals
from django_delayjobs.connection import get_engine
from django_delayjobs.models import Job, Status
from django_delayjobs.preflight import check_owner
from django_delayjobs.worker import Options, WorkerDied, WorkerProcess
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("signal_name", "status"),
    [("job_started", Status.RUNNING), ("job_succeeded", Status.SUCCEEDED)],
)
def test_a_signal_receiver_that_never_returns_stops_the_worker_past_max_run_seconds(
    settings, signal_name, status
):
    """A receiver runs in the worker thread, as the action does: one that never returns
    (a call with no timeout) would leave a process that heartbeats and does nothing. Past
    MAX_RUN_SECONDS the process stops with an error, as for an action."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "MAX_RUN_SECONDS": 1,
                          "SHUTDOWN_GRACE_SECONDS": 0}  # fmt: skip
    release = threading.Event()

    def stuck(sender, job, **kwargs):
        release.wait(10)  # far past the limit; released once the worker has stopped

    getattr(signals, signal_name).connect(stuck)
    job = schedule(tasks.record, in_=0, args=["ran"])
    check_owner(get_engine())
    process = WorkerProcess(get_engine(), Options(queues=["default"], burst=True))
    started = time.monotonic()
    try:
        with pytest.raises(WorkerDied, match=r"MAX_RUN_SECONDS \(1 s\)"):
            process.run()
        assert time.monotonic() - started < 8
        assert Job.objects.get(pk=job.pk).status == status
    finally:
        release.set()
        getattr(signals, signal_name).disconnect(stuck)
        for thread in process.threads:
            thread.join(10)
    assert get_engine().stats("default").live_workers == 0
    assert Record.objects.filter(label="ran").count() == 1  # it ends once released
