"""Audit of a worker's way out: an action past ``MAX_RUN_SECONDS`` keeps running until its
process exits, so its retry must not be due before then."""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.models import EventKind, Status
from tests.helpers import start_worker, wait_for
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_the_retry_of_an_action_past_max_run_seconds_is_due_only_once_its_process_is_gone(
    redis_url, tmp_path
):
    """The attempt is failed while its action still runs, in a process that lives on for
    up to its shutdown grace, then as long again for the interpreter's exit. A retry due
    in its usual backoff (here 0.25-0.5 s) would have another worker run the next attempt
    beside the one still running: the outside effects twice at once."""
    grace = 3.0
    env = {"DELAYJOBS_MAX_RUN_SECONDS": "1", "DELAYJOBS_SHUTDOWN_GRACE_SECONDS": str(grace),
           "DELAYJOBS_RETRY_BACKOFF_SECONDS": "0.5"}  # fmt: skip
    worker = start_worker(redis_url, env=env, log=tmp_path / "w.log")
    try:
        wait_for(lambda: get_engine().stats("default").live_workers == 1)
        # Not atomic: no transaction of the action's holds the failure's write back.
        job = schedule(tasks.slow_outside, in_=0, args=["stuck", 600.0])
        assert worker.wait(60) == 1
    finally:
        if worker.poll() is None:
            worker.kill()
    job.refresh_from_db()
    assert job.status == Status.RETRYING and "MAX_RUN_SECONDS" in job.last_error
    failed_at = job.events.get(kind=EventKind.FAILED).at
    assert job.run_at >= failed_at + timedelta(seconds=2 * grace), (job.run_at, failed_at)
    engine = get_engine()  # Redis holds the same due time: the nack's
    score = engine.client.zscore(
        engine.keys(engine.home("default", str(job.pk))).pending, str(job.pk)
    )
    assert score is not None and score >= job.run_at.timestamp() * 1000 - 1, (score, job.run_at)
