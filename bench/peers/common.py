"""What every system's job does, and the adapter interface.

The job records its own start time: ``RPUSH`` of ``[job_id, due, started]`` (epoch
seconds) to a list in the same private Redis the system uses.
"""

from __future__ import annotations

import json
import os
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import redis

RESULTS_KEY = "bench:results"
_client: redis.Redis | None = None


def redis_url() -> str:
    return os.environ["BENCH_REDIS_URL"]


def record(job_id: str, due: float) -> None:
    started = time.time()
    global _client
    if _client is None:
        _client = redis.Redis.from_url(redis_url())
    _client.rpush(RESULTS_KEY, json.dumps([job_id, due, started]))


def delay_s(due: float) -> float:
    return max(0.0, due - time.time())


def bin_path(name: str) -> str:
    return str(Path(sys.executable).parent / name)


class Adapter:
    """One system: how to schedule a job, how to start its one worker process."""

    name = ""
    packages: tuple[str, ...] = ()
    settings: dict[str, Any] = {}
    # W5 (compare.py): the adapter's worker_cmd(concurrency=n) runs n worker threads.
    scales = False

    def versions(self) -> dict[str, str]:
        return {p: version(p) for p in self.packages}

    def worker_cmd(self) -> list[str]:
        raise NotImplementedError

    def schedule(self, job_id: str, due: float) -> None:
        """Schedule one job due at ``due`` (epoch seconds), the system's idiomatic way."""
        raise NotImplementedError

    def schedule_batch(self, items: list[tuple[str, float]]) -> None:
        """A batch API, where the system has one; else one at a time."""
        for job_id, due in items:
            self.schedule(job_id, due)

    has_batch = False

    def prefill(self, items: list[tuple[str, float]]) -> None:
        """W4's backlog: the fastest way the system offers (RQ pipelines its own calls)."""
        self.schedule_batch(items)

    def reset(self) -> None:
        """Forget state outside Redis between workloads (Redis itself is flushed)."""

    def live_workers(self) -> int | None:
        """How many worker processes say they are up, where the system tells (else None);
        the harness waits for all of them before it measures."""
        return None
