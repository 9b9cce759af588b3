"""Audit of races and real failures: workers killed or cut off from Redis at each point of
a job's life, Redis restarted with and without its data, and what the row and Redis say
of every job once it is over."""

from __future__ import annotations

import signal

import pytest

from django_delayjobs import schedule, schedule_many
from django_delayjobs.connection import get_engine
from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.engine import Engine
from django_delayjobs.models import Job, Status
from django_delayjobs.reconcile import reconcile
from django_delayjobs.services import build_job
from django_delayjobs.worker import Backoff, Options, WorkerProcess
from tests.helpers import start_worker, stop, wait_for
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True)


def status(job: Job) -> str:
    return Job.objects.filter(pk=job.pk).values_list("status", flat=True).get()


def test_a_dead_job_whose_bury_was_lost_goes_to_garbage_when_it_comes_back(tmp_path, settings):
    """The action failed for good and Redis went down before the worker could move the id
    to garbage: it came back in flight with Redis's data, was delivered again once its
    lease ended, found its row dead, and was acked. The dead job was missing from the
    garbage (the queue page, its requeue and purge buttons, the garbage count) for good."""
    server = EmbeddedRedis(tmp_path / "redis")
    url = server.start()
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": url}
    worker = start_worker(url, env={"DELAYJOBS_LEASE_SECONDS": "1"}, log=tmp_path / "w.log")
    try:
        wait_for(lambda: get_engine().stats("default").live_workers)
        job = schedule(tasks.stop_redis_saving_then_fail, in_=0, args=[url], max_attempts=1)
        wait_for(lambda: status(job) == Status.DEAD)
        server.start()  # with its data: the id in flight, its lease running out
        engine = get_engine()
        # Not "in flight no more": the lease's end moves it to ready first (seen in CI).
        wait_for(lambda: [pk for pk, _ in engine.garbage("default")] == [str(job.pk)])
        stats = engine.stats("default")
        assert (stats.pending, stats.ready, stats.in_flight, stats.garbage) == (0, 0, 0, 1)
    finally:
        assert stop(worker) == 0
        server.close()
    assert list(Job.objects.get(pk=job.pk).events.values_list("kind", flat=True)) == [
        "scheduled", "started", "failed", "dead",
    ]  # fmt: skip


@pytest.mark.parametrize("workers", [["2"], ["1", "1"]], ids=["threads", "processes"])
def test_a_claimed_id_whose_lease_was_lost_before_it_started_is_not_run_a_second_time(
    redis_client, redis_url, tmp_path, workers
):
    """A worker thread claimed two ids at once (``PREFETCH``) and ran the first; Redis lost
    its data meanwhile. The reconcile sweep put the second one back in ready, where another
    thread (of the same process, or of another) took it and ran it; once the first job was
    over, the first thread ran the second one too (its running row read as a delivery
    whose worker was lost), beside the other: a non-atomic action's effect twice."""
    logs = [tmp_path / f"{n}.log" for n in range(len(workers))]
    env = {"DELAYJOBS_LEASE_SECONDS": "1"}
    processes = [
        start_worker(redis_url, "--worker-only", "--concurrency", threads, env=env, log=log)
        for threads, log in zip(workers, logs, strict=True)
    ]
    try:
        wait_for(lambda: get_engine().stats("default").live_workers == len(workers))
        first = build_job(tasks.slow, in_=0, args=["first", 2.0])
        second = build_job(tasks.slow_outside, in_=0, args=["second", 3.0])
        schedule_many([first, second])  # one add: one thread claims both
        wait_for(lambda: status(first) == Status.RUNNING)
        assert status(second) == Status.SCHEDULED
        redis_client.flushdb()  # a restart without persistence
        lost = f"lost the lease of job {second.pk}"
        wait_for(lambda: any(lost in log.read_text() for log in logs))
        reconcile(get_engine())  # the first back in flight, the second in ready
        wait_for(lambda: status(second) == Status.SUCCEEDED, timeout=10)
        wait_for(lambda: status(first) == Status.SUCCEEDED, timeout=10)
    finally:
        assert [stop(process) for process in processes] == [0] * len(workers)
    assert Record.objects.filter(label="second").count() == 1
    second.refresh_from_db()
    assert (second.attempts, second.deliveries) == (1, 1)


def test_a_job_whose_lease_ended_while_its_worker_was_frozen_is_not_run_again_beside_itself(
    redis_url, tmp_path
):
    """A worker process froze (SIGSTOP: swapping, a long GC pause; Redis frozen does the
    same) for longer than the lease of the job it was running, and the id went back to
    ready. Once the process ran again, its idle thread claimed the id and ran the job a
    second time, beside the thread still running it (the row read as a delivery whose
    worker was lost), and the first run's outcome was overtaken."""
    log = tmp_path / "w.log"
    env = {"DELAYJOBS_LEASE_SECONDS": "1"}
    worker = start_worker(redis_url, "--concurrency", "2", env=env, log=log)
    engine = get_engine()
    try:
        wait_for(lambda: engine.stats("default").live_workers)
        job = schedule(tasks.slow_outside, in_=0, args=["once", 2.0])
        wait_for(lambda: status(job) == Status.RUNNING)
        worker.send_signal(signal.SIGSTOP)
        try:
            assert wait_for(lambda: engine.recover_expired("default"), timeout=5) == [str(job.pk)]
        finally:
            worker.send_signal(signal.SIGCONT)
        wait_for(lambda: status(job) == Status.SUCCEEDED, timeout=10)
        wait_for(lambda: engine.stats("default").in_flight == 0)
    finally:
        assert stop(worker) == 0
    assert Record.objects.filter(label="once").count() == 1
    job.refresh_from_db()
    assert (job.attempts, job.deliveries) == (1, 1)


class ClaimedAgainDuringTheExtension(Engine):
    """An engine whose lease extension finds one id out of flight, and before it returns,
    another thread of the worker claims that id again from ready: the window between the
    extension's answer and its bookkeeping (a fast retry's id, taken at once)."""

    def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.meanwhile = lambda: None

    def extend_lease(self, queue, ids, lease_ms):  # type: ignore[no-untyped-def]
        kept = super().extend_lease(queue, ids, lease_ms)
        self.meanwhile()
        return kept


def test_an_id_claimed_again_while_a_lease_extension_is_under_way_is_not_let_go():
    """The extension marked the id lost after the process had claimed it again: the thread
    holding it then let it go instead of running it, and it waited in flight, unheld and
    unextended, until its lease ended."""
    engine = ClaimedAgainDuringTheExtension(get_engine().client, prefix=get_engine().prefix)
    process = WorkerProcess(engine, Options(queues=["default"]))
    job = schedule(tasks.record, in_=0, args=["once"])
    assert wait_for(lambda: process.claim(["default"])) == ("default", [str(job.pk)])
    engine.nack("default", {str(job.pk): 0})  # its lease ended: back in ready
    wait_for(lambda: engine.promote("default").moved)
    claimed: list[tuple[str, list[str]] | None] = []
    engine.meanwhile = lambda: claimed.append(process.claim(["default"]))
    process.extend_leases()
    assert claimed == [("default", [])]  # in flight again, still this thread's to run
    process.run_batch("default", [str(job.pk)], Backoff(process.stopping, "test"))
    assert status(job) == Status.SUCCEEDED
    assert Record.objects.filter(label="once").count() == 1
