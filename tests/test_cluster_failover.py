"""A master of the session's Redis Cluster is killed (SIGKILL) while two workers run 5,000
jobs; its replica takes over. Every job must reach exactly one terminal outcome and every
effect row must exist once. Replication is asynchronous, so the replica may lack the last
writes of the dead master: reconcile puts back lost adds, leases bring back lost acks, and
the attempt fence keeps a job that is delivered twice from committing twice.

Run once per CI run (``-m cluster``), on PostgreSQL when DATABASE_URL is set. It prints
the time from the kill to the last job's completion.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db.models import Count, Max, Min
from django.utils import timezone

from django_delayjobs.engine import close_client
from django_delayjobs.models import EventKind, Job, JobEvent, Status
from django_delayjobs.services import build_job, schedule_many
from tests.conftest import cluster_client
from tests.helpers import start_worker, stop, wait_for
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(600),
]

N = 5000


def test_killing_a_master_mid_run_loses_no_job_and_doubles_no_effect(
    redis_cluster, settings, tmp_path, capsys
):
    redis_cluster.wait_healthy()
    client = cluster_client(redis_cluster.url)
    client.flushall()
    close_client(client)
    shards = '{"default": 6}'
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": redis_cluster.url,
                          "REDIS_CLUSTER": True, "QUEUE_SHARDS": {"default": 6}}  # fmt: skip
    env = {
        "DELAYJOBS_TEST_REDIS_CLUSTER": "1",
        "DELAYJOBS_TEST_QUEUE_SHARDS": shards,
        "DELAYJOBS_RECONCILE_SECONDS": "1",
        "DELAYJOBS_LEASE_SECONDS": "5",
    }
    logs = [tmp_path / f"worker{n}.log" for n in range(2)]
    workers = [start_worker(redis_cluster.url, "--concurrency", "2", env=env, log=log)
               for log in logs]  # fmt: skip
    victim = redis_cluster.master_nodes()[0]
    try:
        wait_for(lambda: all("cluster, 3 masters" in log.read_text() for log in logs), 60)
        start = timezone.now() + timedelta(seconds=1)
        schedule_many(
            build_job(tasks.record, at=start + timedelta(milliseconds=n % 4000), args=[str(n)])
            for n in range(N)
        )
        wait_for(lambda: Record.objects.count() >= N // 5, timeout=120, every=0.05)
        first = Job.objects.aggregate(first=Min("started_at"))["first"]
        killed_at = timezone.now()
        redis_cluster.kill(victim)
        done_at_kill = Record.objects.count()
        wait_for(lambda: len(redis_cluster.master_nodes()) == 3, timeout=60, every=0.1)
        promoted_after = (timezone.now() - killed_at).total_seconds()
        wait_for(lambda: Job.objects.filter(status=Status.SUCCEEDED).count() == N, timeout=300,
                 every=0.5)  # fmt: skip
    finally:
        codes = [stop(w, timeout=60) for w in workers]
        redis_cluster.restart(victim)  # rejoins as a replica: the next test has 3 + 3 again
    assert codes == [0, 0]

    # Exactly one terminal outcome per job, one effect row per job, one success event.
    assert dict(Job.objects.values_list("status").annotate(n=Count("pk"))) == {Status.SUCCEEDED: N}
    assert Record.objects.count() == N
    assert Record.objects.values("label").distinct().count() == N
    succeeded = (
        JobEvent.objects.filter(kind=EventKind.SUCCEEDED).values("job").annotate(n=Count("pk"))
    )
    assert succeeded.count() == N and {row["n"] for row in succeeded} == {1}

    last = Job.objects.aggregate(last=Max("finished_at"))["last"]
    recovery = (last - killed_at).total_seconds()
    rate = done_at_kill / (killed_at - first).total_seconds()  # jobs/s before the kill
    redelivered = (
        Job.objects.filter(deliveries__gt=1).count() + Job.objects.filter(attempts__gt=1).count()
    )
    readded = 0
    for log in logs:
        text = log.read_text()
        readded += sum(int(n) for n in re.findall(r"reconcile re-added (\d+) job", text))
        assert "Traceback" not in text, text[-3000:]
        # One line when an outage starts and one when it ends, per loop (worker, promoter,
        # reconcile, housekeeping), not one per failed call. A loop may see more than one
        # outage (connection refused, then "the cluster is down" until the replica is
        # promoted), and every one of them must end before the jobs are all done.
        outages = text.count("Redis is unavailable")
        assert outages == len(re.findall(r"back after \d+ failed", text)), text[-3000:]
    with capsys.disabled():
        print(
            f"\nfailover: master {victim.address} killed with {done_at_kill} of {N} jobs done "
            f"({rate:.0f} jobs/s until then, so the rest alone needed about "
            f"{(N - done_at_kill) / rate:.1f} s); "
            f"replica promoted after {promoted_after:.1f} s; last job completed "
            f"{recovery:.1f} s after the kill; reconcile re-added {readded} id(s) Redis did not "
            f"hold; {redelivered} job(s) delivered more than once"
        )
