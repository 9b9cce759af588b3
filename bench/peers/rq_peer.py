"""RQ: ``Queue.enqueue_in`` and ``rq worker --with-scheduler`` (forks a work horse per job)."""

from __future__ import annotations

import datetime
import inspect
import os

import redis
from rq import Queue
from rq.defaults import DEFAULT_RESULT_TTL
from rq.scheduler import RQScheduler

from peers import common

QUEUE = "bench"


class Adapter(common.Adapter):
    name = "rq"
    packages = ("rq", "redis")
    settings = {
        "client": "Queue.enqueue_in(timedelta(seconds=due - now), record, ...); W4 backlog: "
        "create_job + schedule_job(pipeline=...), 1000 per pipeline",
        "worker": "rq worker --with-scheduler (default Worker: forks per job)",
        "scheduler interval": f"{inspect.signature(RQScheduler).parameters['interval'].default}"
        " s (RQ default)",
        "result_ttl": f"{DEFAULT_RESULT_TTL} s (RQ default)",
    }

    def __init__(self) -> None:
        self.queue = Queue(QUEUE, connection=redis.Redis.from_url(os.environ["BENCH_REDIS_URL"]))

    def worker_cmd(self) -> list[str]:
        return [
            common.bin_path("rq"), "worker", "--with-scheduler", "--quiet",
            "--url", os.environ["BENCH_REDIS_URL"], QUEUE,
        ]  # fmt: skip

    def schedule(self, job_id: str, due: float) -> None:
        delay = datetime.timedelta(seconds=common.delay_s(due))
        self.queue.enqueue_in(delay, common.record, job_id, due)

    def prefill(self, items: list[tuple[str, float]]) -> None:
        # What enqueue_at does, with RQ's own pipeline argument, 1,000 jobs per round trip.
        for start in range(0, len(items), 1000):
            with self.queue.connection.pipeline() as pipe:
                for job_id, due in items[start : start + 1000]:
                    job = self.queue.create_job(common.record, args=(job_id, due))
                    when = datetime.datetime.fromtimestamp(due, datetime.UTC)
                    self.queue.schedule_job(job, when, pipeline=pipe)
                pipe.execute()
