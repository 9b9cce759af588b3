"""Celery: ``apply_async(countdown=...)`` on the Redis broker; ``celery worker -c 1``."""

from __future__ import annotations

import os
import sys

from celery import Celery
from kombu.transport.redis import Channel

from peers import common

_socket = os.environ.get("BENCH_REDIS_URL", "unix:///nonexistent").removeprefix("unix://")
app = Celery("bench", broker=f"redis+socket://{_socket}")
app.conf.update(
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="bench.record")
def record(job_id: str, due: float) -> None:
    common.record(job_id, due)


class Adapter(common.Adapter):
    name = "celery"
    packages = ("celery", "kombu", "billiard", "redis")
    settings = {
        "client": "record.apply_async(args, countdown=due - now)",
        "broker": "Redis (redis+socket), default transport options: visibility_timeout "
        f"{Channel.visibility_timeout} s",
        "worker": "celery worker -c 1 (prefork pool, one child); default prefetch multiplier "
        f"{app.conf.worker_prefetch_multiplier}",
        "task_ignore_result": True,
        "note": "ETA tasks are held in worker memory until due (Celery's design)",
    }

    def worker_cmd(self) -> list[str]:
        return [
            sys.executable, "-m", "celery", "-A", "peers.celery_peer", "worker",
            "-c", "1", "--loglevel", "WARNING", "--without-gossip", "--without-mingle",
        ]  # fmt: skip

    def schedule(self, job_id: str, due: float) -> None:
        record.apply_async((job_id, due), countdown=common.delay_s(due))
