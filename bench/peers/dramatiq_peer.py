"""Dramatiq: ``RedisBroker`` and ``send_with_options(delay=ms)``; ``dramatiq -p 1 -t 1``."""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.worker import DELAY_QUEUE_PREFETCH

from peers import common

dramatiq.set_broker(RedisBroker(url=os.environ.get("BENCH_REDIS_URL", "unix:///nonexistent")))


@dramatiq.actor(queue_name="bench", max_retries=0)
def record(job_id: str, due: float) -> None:
    common.record(job_id, due)


class Adapter(common.Adapter):
    name = "dramatiq"
    packages = ("dramatiq", "redis")
    settings = {
        "client": "record.send_with_options(args, delay=ms)",
        "broker": "RedisBroker, default middleware",
        "worker": "dramatiq -p 1 -t 1 (one process, one worker thread)",
        "note": "delayed messages go to the .DQ queue and are held by the worker until due",
        "delay prefetch": f"{DELAY_QUEUE_PREFETCH or 1000} delayed messages held at most "
        "(Dramatiq default: 1,000 per worker thread)",
    }

    def worker_cmd(self) -> list[str]:
        return [common.bin_path("dramatiq"), "peers.dramatiq_peer", "-p", "1", "-t", "1"]

    def schedule(self, job_id: str, due: float) -> None:
        record.send_with_options(args=(job_id, due), delay=int(common.delay_s(due) * 1000))
