"""Huey: ``RedisHuey`` and ``task.schedule(delay=...)``; ``huey_consumer -w 1 -k thread``."""

from __future__ import annotations

import os

from huey import RedisHuey
from huey.consumer_options import config_defaults

from peers import common

huey = RedisHuey("bench", url=os.environ.get("BENCH_REDIS_URL", "unix:///nonexistent"))


@huey.task()
def record(job_id: str, due: float) -> None:
    common.record(job_id, due)


class Adapter(common.Adapter):
    name = "huey"
    packages = ("huey", "redis")
    settings = {
        "client": "record.schedule(args, delay=due - now)",
        "storage": f"RedisHuey (blocking {huey.storage.blocking}, read_timeout "
        f"{huey.storage.read_timeout} s)",
        "consumer": "huey_consumer -w 1 -k thread (default logging: INFO, a line per task)",
        "scheduler interval": f"{dict(config_defaults)['scheduler_interval']} s (Huey default, -s)",
    }

    def worker_cmd(self) -> list[str]:
        return [common.bin_path("huey_consumer"), "peers.huey_peer.huey", "-w", "1", "-k", "thread"]

    def schedule(self, job_id: str, due: float) -> None:
        record.schedule(args=(job_id, due), delay=common.delay_s(due))
