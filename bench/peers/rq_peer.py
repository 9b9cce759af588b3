"""RQ: ``Queue.enqueue_in`` and ``rq worker --with-scheduler`` (forks a work horse per job)."""

from __future__ import annotations

import datetime
import os

import redis
from rq import Queue

from peers import common

QUEUE = "bench"


class Adapter(common.Adapter):
    name = "rq"
    packages = ("rq", "redis")
    settings = {
        "client": "Queue.enqueue_in(timedelta(seconds=due - now), record, ...)",
        "worker": "rq worker --with-scheduler (default Worker: forks per job)",
        "scheduler interval": "1 s (RQ default)",
        "result_ttl": "500 s (RQ default)",
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
