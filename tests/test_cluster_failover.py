"""Failover on Redis Cluster (``-m cluster``; this module runs once per CI run).

A master of the session's Redis Cluster is killed (SIGKILL) while two workers run 5,000
jobs; its replica takes over. Every job must reach exactly one terminal outcome and every
effect row must exist once. Replication is asynchronous, so the replica may lack the last
writes of the dead master: reconcile puts back lost adds, leases bring back lost acks, and
the attempt fence keeps a job that is delivered twice from committing twice. That test runs
on PostgreSQL when DATABASE_URL is set and prints the time from the kill to the last job's
completion.

Then, on a private cluster of 3 masters and no replicas with a long
``cluster-node-timeout`` (a killed master stays down, its slots unserved, while the other
two serve theirs: the window a real failover leaves), every loop over shards must go on
with the shards on the healthy masters (docs/cluster.md, Failover).
"""

from __future__ import annotations

import contextlib
import logging
import re
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db.models import Count, Max, Min
from django.utils import timezone

from django_delayjobs import connection, health, schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.embedded_cluster import EmbeddedCluster, Node
from django_delayjobs.engine import Engine, EngineUnavailable, close_client
from django_delayjobs.metrics import store
from django_delayjobs.models import EventKind, Job, JobEvent, Status
from django_delayjobs.promoter import Promoter
from django_delayjobs.reconcile import reconcile
from django_delayjobs.services import build_job, schedule_many
from django_delayjobs.worker import Options, WorkerProcess
from tests.conftest import cluster_client
from tests.helpers import start_worker, stop, wait_for
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

N = 5000
SHARDS = {"q": 6}


def outages_ended(log: str) -> bool:
    """Whether each outage a worker's log reports ("Redis is unavailable") has its end
    ("back after N failed ...") logged too."""
    return log.count("Redis is unavailable") == len(re.findall(r"back after \d+ failed", log))


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(600)
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
        # Every loop logs its outage's end once its next call succeeds, which may come
        # just after the last job (the other shards and the other process served them).
        # (Not ended after 30 s: each log's assertion below shows it.)
        with contextlib.suppress(AssertionError):
            wait_for(lambda: all(outages_ended(log.read_text()) for log in logs), timeout=30)
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
        # promoted), and every one of them must end: no loop is left failing.
        assert outages_ended(text), text[-3000:]
    with capsys.disabled():
        print(
            f"\nfailover: master {victim.address} killed with {done_at_kill} of {N} jobs done "
            f"({rate:.0f} jobs/s until then, so the rest alone needed about "
            f"{(N - done_at_kill) / rate:.1f} s); "
            f"replica promoted after {promoted_after:.1f} s; last job completed "
            f"{recovery:.1f} s after the kill; reconcile re-added {readded} id(s) Redis did not "
            f"hold; {redelivered} job(s) delivered more than once"
        )


def test_health_after_a_failover_checks_the_new_masters(redis_cluster):
    """A long-lived process (a web process answering ``health/``) checked every master;
    one fails over, its replica takes over, it comes back as a replica: the check must
    look at the masters there are now, not at the old one (now a replica) forever."""
    redis_cluster.wait_healthy()
    client = cluster_client(redis_cluster.url, socket_timeout=1.0, socket_connect_timeout=1.0)
    engine = Engine(client, prefix="audit")
    try:
        assert health.check_redis(engine)[0].ok
        victim = redis_cluster.master_nodes()[0]
        redis_cluster.kill(victim)
        wait_for(
            lambda: (
                len(redis_cluster.master_nodes()) == 3
                and victim not in redis_cluster.master_nodes()
            ),
            timeout=60,
            every=0.1,
        )
        redis_cluster.restart(victim)  # rejoins as a replica
        wait_for(lambda: victim.client().info("replication")["role"] == "slave", 60)
        check, _ = health.check_redis(engine)
        assert check.ok, check
    finally:
        engine.close()
        close_client(client)


# -- one master down, the others serving ---------------------------------------------------


@pytest.fixture(scope="module")
def lonely_cluster() -> Iterator[EmbeddedCluster]:
    """3 masters, no replicas; a dead master is not declared failed for 60 s."""
    cluster = EmbeddedCluster(masters=3, replicas=0, node_timeout_ms=60_000)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def engine(lonely_cluster: EmbeddedCluster) -> Iterator[Engine]:
    """An engine on the private cluster (queue ``q`` in 6 shards), every master flushed;
    any master a test killed is started again afterwards."""
    lonely_cluster.wait_healthy()
    client = cluster_client(lonely_cluster.url, socket_timeout=1.0, socket_connect_timeout=1.0)
    client.flushall()
    engine = Engine(client, prefix="audit", shards=SHARDS)
    try:
        yield engine
    finally:
        engine.close()
        close_client(client)
        for node in lonely_cluster.nodes:
            lonely_cluster.restart(node)


def master_of(cluster: EmbeddedCluster, engine: Engine, shard: str) -> Node:
    address = engine.node_of(shard)
    return next(node for node in cluster.nodes if node.address == address)


def test_while_a_master_is_down_the_promoter_promotes_the_shards_on_the_others(
    lonely_cluster, engine
):
    """Every pass of the promoter (recover expired leases, then promote, shard after
    shard) passes over the shards of a dead master and serves the others."""
    shards = engine.shards("q")
    now = engine.server_time_ms()
    ids = [str(uuid.uuid4()) for _ in range(600)]
    engine.add("q", dict.fromkeys(ids, now + 1000))  # pending, due in 1 s
    held = {shard: engine.stats(shard).pending for shard in shards}
    victim = master_of(lonely_cluster, engine, shards[0])
    healthy = [s for s in shards if master_of(lonely_cluster, engine, s) is not victim]
    assert healthy and all(held[s] for s in healthy)  # 600 ids over 6 shards

    lonely_cluster.kill(victim)
    promoter = Promoter(engine, ["q"], tick=0.2)
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:  # what promote_loop does, minus its pause
        with contextlib.suppress(EngineUnavailable):
            promoter.step()
        if all(engine.stats(s).ready == held[s] for s in healthy):
            break
        time.sleep(0.1)
    ready = {s: engine.stats(s).ready for s in healthy}
    assert ready == {s: held[s] for s in healthy}


def test_while_a_master_is_frozen_the_promoter_keeps_the_pace_of_the_others(lonely_cluster, engine):
    """A master that does not answer (frozen, or cut off by a partition) cost each call to
    each of its shards the client's timeout and a retry, at every pass: the healthy
    masters' shards were promoted seconds late until the failover."""
    engine = Engine(connection.cluster_client(lonely_cluster.url), prefix="audit", shards=SHARDS)
    try:
        frozen_master_passed_over(lonely_cluster, engine)
    finally:
        engine.close()


def test_while_a_master_is_frozen_the_workers_claim_from_the_others(lonely_cluster, engine):
    """The worker threads' claims went to every shard in turn, the frozen master's too:
    each claim that met one of its shards waited out the client's timeout and its retry,
    so the healthy shards' due jobs were claimed seconds late, claim after claim, until
    the failover. The claims pass over that master as the promoter does."""
    shards = engine.shards("q")
    directory = engine.client.get_node_from_key(engine.queues_key).name
    victim = next(n for n in (master_of(lonely_cluster, engine, s) for s in shards)
                  if n.address != directory)  # fmt: skip
    healthy = [s for s in shards if master_of(lonely_cluster, engine, s) is not victim]
    frozen = [s for s in shards if s not in healthy]
    due = engine.server_time_ms()
    for shard in shards:  # due now: in ready at once
        engine.add(shard, {f"{shard}-{n}": due for n in range(8)})
    process = WorkerProcess(engine, Options(queues=["q"], tick=0.1))
    process.prefetch = 1  # a claim per job: many claims, each meeting the shards in turn
    assert victim.process is not None
    victim.process.send_signal(signal.SIGSTOP)
    try:
        breaker = process.promoter.breaker  # the process's: shared by its threads
        with contextlib.suppress(EngineUnavailable), breaker.guard(frozen[0]):
            engine.claim(frozen[0], 1, 60_000)  # one claim meets the frozen master
        claimed: list[str] = []
        started = time.monotonic()
        while len(claimed) < 8 * len(healthy):
            with contextlib.suppress(EngineUnavailable):
                found = process.claim(["q"])
                claimed += found[1] if found else []
            assert time.monotonic() - started < 60
        took = time.monotonic() - started
    finally:
        victim.process.send_signal(signal.SIGCONT)
    assert sorted(claimed) == sorted(f"{s}-{n}" for s in healthy for n in range(8))
    assert took < 1.5, f"{len(claimed)} ids claimed in {took:.1f} s"


def frozen_master_passed_over(lonely_cluster: EmbeddedCluster, engine: Engine) -> None:
    """The test above with the client ``get_engine`` uses (its timeouts and one retry)."""
    shards = engine.shards("q")
    engine.add("q", {str(uuid.uuid4()): 4e12 for _ in range(60)})  # every shard listed
    # Not the directory's master: the directory is read again every few seconds.
    directory = engine.client.get_node_from_key(engine.queues_key).name
    victim = next(n for n in (master_of(lonely_cluster, engine, s) for s in shards)
                  if n.address != directory)  # fmt: skip
    healthy = [s for s in shards if master_of(lonely_cluster, engine, s) is not victim]
    frozen = [s for s in shards if s not in healthy]
    assert all(engine.stats(s).pending for s in shards)
    promoter = Promoter(engine, ["q"], tick=0.2)
    promoter.step()
    assert victim.process is not None
    victim.process.send_signal(signal.SIGSTOP)
    try:
        with contextlib.suppress(EngineUnavailable):
            promoter.step()  # meets the frozen master
        due = time.time() * 1000 + 300
        for shard in healthy:
            engine.add(shard, {f"{shard}-late": due})
        started = time.monotonic()
        while not all(engine.stats(s).ready for s in healthy):
            with contextlib.suppress(EngineUnavailable):
                promoter.step()
            assert time.monotonic() - started < 30
        took = time.monotonic() - started
        assert took < 1.5, f"due in 0.3 s, promoted after {took:.1f} s"
    finally:
        victim.process.send_signal(signal.SIGCONT)
    engine.add(frozen[0], {"back": time.time() * 1000 + 100})

    def promoted() -> bool:
        with contextlib.suppress(EngineUnavailable):
            promoter.step()
        return engine.stats(frozen[0]).ready == 1

    wait_for(promoted, timeout=15)  # served again once it answers


@pytest.mark.django_db
def test_while_a_master_is_down_reconcile_repairs_the_shards_on_the_others(
    lonely_cluster, engine, settings
):
    """Reconcile re-adds the jobs of every shard it can reach (``Engine.add`` and
    ``requeue`` go on past a shard whose master is down), then reports the failure."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": lonely_cluster.url,
                          "REDIS_CLUSTER": True, "QUEUE_SHARDS": SHARDS}  # fmt: skip
    # django_db without transaction=True: the on-commit adds never run, so Redis holds
    # none of these jobs (as after adds that failed, or a Redis that lost its data).
    jobs = schedule_many(
        build_job(tasks.record, in_=0, args=[str(n)], queue="q") for n in range(200)
    )
    homes = {str(job.pk): engine.home("q", str(job.pk)) for job in jobs}
    victim = master_of(lonely_cluster, engine, engine.shards("q")[0])
    healthy = {s for s in engine.shards("q") if master_of(lonely_cluster, engine, s) is not victim}
    wanted = {id_ for id_, shard in homes.items() if shard in healthy}
    assert wanted

    lonely_cluster.kill(victim)
    with pytest.raises(EngineUnavailable):
        reconcile(engine)
    held = {id_ for shard in healthy for id_, _ in engine.next_due(shard, 1000)}
    held |= {
        i.decode()
        for shard in healthy
        for i in engine.client.smembers(engine.keys(shard).ready_set)
    }
    assert held == wanted


@pytest.mark.django_db
def test_a_full_reconcile_repairs_every_chunk_while_the_directory_s_master_is_down(
    lonely_cluster, engine, settings
):
    """``delayjobs_reconcile`` (a new process: it has never read the directory of queues)
    while the master that holds the directory is down: the shards of older counts cannot
    be listed, yet the shards on the other masters are repaired, every chunk of them."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": lonely_cluster.url,
                          "REDIS_CLUSTER": True, "QUEUE_SHARDS": SHARDS}  # fmt: skip
    jobs = schedule_many(
        build_job(tasks.record, in_=0, args=[str(n)], queue="q") for n in range(2500)
    )
    address = engine.client.get_node_from_key(engine.queues_key).name
    victim = next(node for node in lonely_cluster.nodes if node.address == address)
    healthy = {s for s in engine.shards("q") if master_of(lonely_cluster, engine, s) is not victim}
    wanted = {str(job.pk) for job in jobs if engine.home("q", str(job.pk)) in healthy}

    lonely_cluster.kill(victim)
    fresh = Engine(engine.client, prefix="audit", shards=SHARDS)
    with pytest.raises(EngineUnavailable):
        reconcile(fresh)
    held = {
        i.decode()
        for shard in healthy
        for i in engine.client.smembers(engine.keys(shard).ready_set)
    }
    assert len(held) == len(wanted) and held == wanted


def test_reschedule_reaches_its_shard_while_the_directory_s_master_is_down(lonely_cluster, engine):
    """``Engine.reschedule`` looks in the shards of older counts only for an id its own
    shard does not hold: a new process moved no id at all while the master of the
    directory (which lists those shards) was down, wherever the id was."""
    address = engine.client.get_node_from_key(engine.queues_key).name
    victim = next(node for node in lonely_cluster.nodes if node.address == address)
    now = engine.server_time_ms()
    ids = [str(uuid.uuid4()) for _ in range(30)]
    engine.add("q", dict.fromkeys(ids, now + 3_600_000))
    job_id = next(
        i for i in ids if master_of(lonely_cluster, engine, engine.home("q", i)) is not victim
    )

    lonely_cluster.kill(victim)
    fresh = Engine(engine.client, prefix="audit", shards=SHARDS)
    assert fresh.reschedule("q", job_id, now + 60_000) is True
    assert fresh.next_due(engine.home("q", job_id), 100)[0] == (job_id, now + 60_000)


def test_while_a_master_is_down_the_leases_held_on_the_others_are_extended(lonely_cluster, engine):
    """A running job's lease is extended while its shard's master is up, whatever became of
    the master of another running job's shard (else ``recover_expired`` would hand the job
    to a second worker once its lease ends)."""
    shards = engine.shards("q")
    victim = master_of(lonely_cluster, engine, shards[0])
    healthy = next(s for s in shards if master_of(lonely_cluster, engine, s) is not victim)
    now = engine.server_time_ms()
    held = {}
    for shard in (shards[0], healthy):  # the dead master's shard first
        job_id = str(uuid.uuid4())
        engine.add(shard, {job_id: now})
        assert engine.claim(shard, 1, lease_ms=2000) == [job_id]
        held[job_id] = shard
    process = WorkerProcess(engine, Options(queues=["q"]))
    process.lease_ms = 600_000
    process.held.update({job_id: (shard, 0) for job_id, shard in held.items()})

    lonely_cluster.kill(victim)
    with pytest.raises(EngineUnavailable):
        process.extend_leases()
    (healthy_id,) = [i for i, s in held.items() if s == healthy]
    deadline = engine.client.zscore(engine.keys(healthy).unack, healthy_id)
    assert deadline is not None and deadline > now + 300_000  # extended, not 2 s


@pytest.mark.django_db(transaction=True)
def test_while_a_master_is_down_schedule_hands_redis_the_jobs_of_the_others(
    lonely_cluster, engine, settings
):
    """The on-commit add of ``schedule()`` adds the ids of every shard it can reach; only
    the dead master's are left to reconcile."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": lonely_cluster.url,
                          "REDIS_CLUSTER": True, "QUEUE_SHARDS": SHARDS}  # fmt: skip
    assert get_engine().shards("q")  # the process's engine has read the slot table
    victim = master_of(lonely_cluster, engine, engine.shards("q")[0])
    healthy = {s for s in engine.shards("q") if master_of(lonely_cluster, engine, s) is not victim}

    lonely_cluster.kill(victim)
    built = [build_job(tasks.record, in_=3600, args=[str(n)], queue="q") for n in range(200)]
    # The first id on the dead master (the ids are grouped by shard in order of appearance).
    built.sort(key=lambda job: engine.home("q", str(job.pk)) in healthy)
    jobs = schedule_many(built)
    wanted = {str(job.pk) for job in jobs if engine.home("q", str(job.pk)) in healthy}
    assert len(wanted) > 100
    held = {id_ for shard in healthy for id_, _ in get_engine().next_due(shard, 1000)}
    assert held == wanted


@pytest.mark.django_db(transaction=True)
def test_while_a_master_is_down_schedule_logs_the_outage_once(
    lonely_cluster, engine, settings, caplog
):
    """The adds of ``schedule()`` to the shards of a dead master fail, those to the others
    succeed, one after the other: that is one outage, logged once, not a warning (and a
    "back" line) for every job whose shard is on the dead master."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": lonely_cluster.url,
                          "REDIS_CLUSTER": True, "QUEUE_SHARDS": SHARDS}  # fmt: skip
    assert get_engine().shards("q")  # the process's engine has read the slot table
    lonely_cluster.kill(master_of(lonely_cluster, engine, engine.shards("q")[0]))
    with caplog.at_level(logging.WARNING):
        for n in range(30):
            schedule(tasks.record, in_=3600, args=[str(n)], queue="q")
    lines = [r.getMessage() for r in caplog.records]
    assert sum("Redis is unavailable" in line for line in lines) == 1, lines
    assert not any("Redis is back" in line for line in lines), lines


def test_while_a_master_is_down_the_metrics_of_queues_on_the_others_are_flushed(
    lonely_cluster, engine
):
    """A metrics flush writes every queue it can reach; a queue on the dead master keeps
    its counts back for the next flush."""
    names = [f"m{n}" for n in range(30)]
    victim = master_of(lonely_cluster, engine, names[0])
    healthy = [q for q in names if master_of(lonely_cluster, engine, q) is not victim]
    queues = sorted([names[0], *healthy[:2]])  # the dead master's queue first
    tallies = {(queue, None): {"succeeded": 1.0} for queue in queues}

    lonely_cluster.kill(victim)
    written: set[str] = set()
    with pytest.raises(EngineUnavailable):
        store.write(engine, tallies, queues, minute=1, ttl=600, written=written)
    assert written == set(healthy[:2])
    assert store.totals(engine, healthy[:2]) == {q: {"succeeded": 1.0} for q in healthy[:2]}


class DiesAfterInfo(Engine):
    """An engine on which a master dies once every master's ``INFO`` has been read."""

    cluster: EmbeddedCluster
    victim: Node

    def masters(
        self, down: dict[str, str] | None = None, before: Callable[[str], None] | None = None
    ) -> dict[str, dict[str, Any]]:
        found = super().masters(down, before)
        self.cluster.kill(self.victim)
        return found


def test_a_master_that_dies_between_info_and_ping_is_unavailable(lonely_cluster, engine):
    """Health reads every master's INFO, then checks that they take writes: a master that
    died in between does not answer at all, it does not "refuse writes"; and the queue
    checks, which would only meet the same dead master, are not run."""
    victim = master_of(lonely_cluster, engine, engine.shards("q")[0])
    dying = DiesAfterInfo(engine.client, prefix="audit", shards=SHARDS)
    dying.cluster, dying.victim = lonely_cluster, victim

    check, reachable = health.check_redis(dying)
    assert not check.ok and not reachable, check
    assert check.detail.startswith("unavailable: Redis is unreachable"), check.detail
