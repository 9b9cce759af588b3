"""Chaos: two worker processes, 2,000 jobs of which some raise random BaseExceptions, while
the test kills the workers' database connections and restarts Redis (losing its data) at
random moments. Every job must reach exactly one terminal outcome, every effect must exist
exactly once, and both workers must come out of it alive and working.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from django_delayjobs import schedule_many
from django_delayjobs.connection import get_engine
from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.models import FINISHED, Job, Status
from django_delayjobs.services import build_job
from tests.helpers import start_worker, stop, wait_for
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.skipif(
        "os.environ.get('DATABASE_URL') is None",
        reason="the chaos test runs on PostgreSQL (connections to kill, concurrent writers); "
        "CI's PostgreSQL pass runs it",
    ),
]

JOBS = 2000
PLANS = ["ok"] * 8 + ["flaky"] + ["doomed"]  # 80% fine, 10% fail once, 10% never succeed


def kill_worker_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
            "current_database() AND pid <> pg_backend_pid()"
        )
        return len(cursor.fetchall())


def unfinished(limit: int = 20) -> str:
    """What the database and Redis say of the jobs that have not finished: for a timeout."""
    client, keys = get_engine().client, get_engine().keys("default")
    out = []
    for job in Job.objects.exclude(status__in=FINISHED).order_by("run_at")[:limit]:
        held = [name for name, key in (("pending", keys.pending), ("unack", keys.unack),
                                       ("garbage", keys.garbage))
                if client.zscore(key, str(job.pk)) is not None]  # fmt: skip
        if client.sismember(keys.ready_set, str(job.pk)):
            held.append("ready")
        events = job.events.order_by("at", "pk").values_list("kind", "attempt", "actor", "at")
        out.append(
            f"{job.pk} {job.status} attempts={job.attempts} deliveries={job.deliveries} "
            f"run_at={job.run_at:%H:%M:%S.%f} worker={job.worker!r} in Redis: {held}\n  "
            + "\n  ".join(f"{a:%H:%M:%S.%f} {k} #{n} {who}" for k, n, who, a in events)
        )
    return "\n".join(out)


def log_tail(path: Path, lines: int = 60) -> str:
    return f"--- the last {lines} lines of {path.name}:\n" + "\n".join(
        path.read_text(errors="replace").splitlines()[-lines:])  # fmt: skip


def test_chaos(tmp_path, settings):
    rng = random.Random(os.environ.get("DELAYJOBS_CHAOS_SEED", "2026"))
    # A fault every 0.3-1.5 s, Redis down up to 0.5 s; DELAYJOBS_CHAOS_FAST=1 (by hand):
    # every 0.05-0.3 s, down up to 0.1 s.
    fast = bool(os.environ.get("DELAYJOBS_CHAOS_FAST"))
    pause, outage = ((0.05, 0.3), 0.1) if fast else ((0.3, 1.5), 0.5)
    server = EmbeddedRedis(tmp_path / "redis")
    url = server.start()
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": url}
    env = {"DELAYJOBS_LEASE_SECONDS": "2", "DELAYJOBS_RECONCILE_SECONDS": "1",
           "DELAYJOBS_RETRY_BACKOFF_SECONDS": "0.05", "DELAYJOBS_MAX_DELIVERIES": "20",
           "DELAYJOBS_HEARTBEAT_SECONDS": "0.5"}  # fmt: skip
    workers = [start_worker(url, "--concurrency", "2", env=env, log=tmp_path / f"w{n}.log")
               for n in range(2)]  # fmt: skip
    plans = [rng.choice(PLANS) for _ in range(JOBS)]
    start = timezone.now()
    faults: Counter[str] = Counter()
    try:
        wait_for(lambda: get_engine().stats("default").live_workers == 2)
        for first in range(0, JOBS, 500):
            schedule_many(
                build_job(tasks.chaos_step, at=start + timedelta(seconds=rng.uniform(0, 8)),
                          args=[n, plans[n], rng.uniform(0.002, 0.02)], max_attempts=2)
                for n in range(first, first + 500)
            )  # fmt: skip
        deadline = time.monotonic() + 300
        while Job.objects.exclude(status__in=FINISHED).exists():
            if time.monotonic() > deadline:
                pytest.fail(
                    "jobs still unfinished after 5 minutes:\n"
                    + unfinished()
                    + "\n"
                    + "\n".join(log_tail(tmp_path / f"w{n}.log") for n in range(2))
                )
            time.sleep(rng.uniform(*pause))
            if rng.random() < 0.6:
                faults["connections killed"] += kill_worker_connections()
            else:
                server.stop()  # no persistence: Redis comes back empty
                time.sleep(rng.uniform(0, outage))
                server.start()
                faults["redis restarts"] += 1
        dead = {n: w.returncode for n, w in enumerate(workers) if w.poll() is not None}
        assert not dead, f"a worker died in the chaos: {dead}\n" + "\n".join(
            log_tail(tmp_path / f"w{n}.log") for n in dead)  # fmt: skip
        # Not alive and idle: both still heartbeat and both still work.
        wait_for(lambda: get_engine().stats("default").live_workers == 2, timeout=30)
        after = schedule_many(build_job(tasks.record, in_=0, args=[f"after{n}"])
                              for n in range(40))  # fmt: skip
        wait_for(lambda: Record.objects.filter(label__startswith="after").count() == 40, 30)
        assert Job.objects.filter(pk__in=[j.pk for j in after]).values("worker").distinct()
    finally:
        codes = [stop(w) for w in workers]
        server.close()
    assert codes == [0, 0]
    assert faults["redis restarts"] >= 2 and faults["connections killed"] >= 2, faults

    statuses = dict(Job.objects.filter(action__endswith="chaos_step").values_list("status")
                    .annotate(n=Count("pk")))  # fmt: skip
    assert sum(statuses.values()) == JOBS
    assert set(statuses) <= {Status.SUCCEEDED, Status.DEAD}, statuses
    effects = Counter(Record.objects.filter(label__startswith="effect:")
                      .values_list("label", flat=True))  # fmt: skip
    assert max(effects.values()) == 1, "an effect was written twice"
    rows = Job.objects.filter(action__endswith="chaos_step").values_list("args", "status")
    for (n, plan, _), status in rows:
        assert (f"effect:{n}" in effects) == (status == Status.SUCCEEDED), (n, plan, status)
        if plan == "doomed":
            assert status == Status.DEAD
        else:  # a random kill may cost a delivery, never the job
            assert status == Status.SUCCEEDED, (n, plan, status)
