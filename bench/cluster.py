"""Benchmark the engine on Redis Cluster: promote + claim + ack with 1 and 6 shards on one
Redis, a 1-master cluster and a 3-master cluster, and Redis CPU per job on each master.

    python bench/cluster.py [--n 60000] [--clients 2] [--claim 10] [--json PATH]

Every configuration gets fresh private servers (``EmbeddedRedis`` / ``EmbeddedCluster``,
masters without replicas) that are stopped at the end. ``--n`` ids are added to the queue
``q`` due at one moment; once they are due, ``--clients`` processes each loop over the
shards (in turn, from a different start): claim (``--claim``, 10 like the worker's
default PREFETCH), promote (batch 1000) when ready ran low, ack; the clock stops when
all ids are acked.
Throughput is n / that time: on a small machine it is bounded by the Python clients, not
by Redis, which is why the CPU figures below matter more.

Redis CPU per job comes from each master: ``INFO cpu`` (user + sys time of the whole
server process, networking included) and ``INFO commandstats`` (time inside commands,
summed over commands; measured as elapsed time, so on a busy machine it also counts time
the server waited for a core), both reset/read around the measured part only, divided by
the jobs whose shard that master holds. One master saturates at 1 s / (CPU per job).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
from redis.cluster import RedisCluster

from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.embedded_cluster import EmbeddedCluster
from django_delayjobs.engine import Engine

Q = "q"
LEASE_MS = 3_600_000


@dataclass(frozen=True)
class Config:
    name: str
    masters: int  # 0: one Redis, not a cluster
    shards: int


CONFIGS = [
    Config("one Redis, 1 shard", 0, 1),
    Config("one Redis, 6 shards", 0, 6),
    Config("cluster of 1 master, 1 shard", 1, 1),
    Config("cluster of 1 master, 6 shards", 1, 6),
    Config("cluster of 3 masters, 1 shard", 3, 1),
    Config("cluster of 3 masters, 6 shards", 3, 6),
]


@contextmanager
def servers(config: Config) -> Iterator[str]:
    if config.masters == 0:
        with EmbeddedRedis() as single:
            yield single.url
        return
    with EmbeddedCluster(masters=config.masters, replicas=0) as cluster:
        yield cluster.url


def connect(url: str, cluster: bool) -> Any:
    if cluster:
        return RedisCluster.from_url(url, socket_timeout=None)
    return redis.Redis.from_url(url, socket_timeout=None)


def master_clients(url: str, cluster: bool) -> dict[str, redis.Redis]:
    if not cluster:
        return {"": redis.Redis.from_url(url)}
    with RedisCluster.from_url(url) as rc:
        return {n.name: redis.Redis(host=n.host, port=n.port) for n in rc.get_primaries()}


def cpu_seconds(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def command_usec(client: redis.Redis) -> int:
    return sum(int(v.get("usec", 0)) for v in client.info("commandstats").values())


def _client(url: str, cluster: bool, shards: int, claim: int, start: int, done: Any) -> None:
    """One client process: claim, promote when ready runs low, ack, shard after shard,
    until none is left."""
    engine = Engine(connect(url, cluster), prefix="bench", shards={Q: shards})
    names = engine.shards(Q)
    order = names[start % len(names) :] + names[: start % len(names)]
    idle_passes = 0
    while idle_passes < 2:
        worked = False
        for shard in order:
            ids = engine.claim(shard, claim, LEASE_MS)
            if len(ids) < claim and engine.promote(shard, 1000).moved:  # ready ran low
                ids += engine.claim(shard, claim - len(ids), LEASE_MS)
            if ids:
                engine.ack(shard, ids)
                with done.get_lock():
                    done.value += len(ids)
            worked = worked or bool(ids)
        idle_passes = 0 if worked else idle_passes + 1


def run(config: Config, n: int, clients: int, claim: int) -> dict[str, Any]:
    cluster = config.masters > 0
    with servers(config) as url:
        client = connect(url, cluster)
        engine = Engine(client, prefix="bench", shards={Q: config.shards})
        due = engine.server_time_ms() + 3_600_000
        ids = [str(uuid.uuid4()) for _ in range(n)]
        for lo in range(0, n, 5000):
            engine.add(Q, dict.fromkeys(ids[lo : lo + 5000], due))
        for shard in engine.shards(Q):  # make every id due now, keeping the layout
            pending = engine.keys(shard).pending
            members = client.zrange(pending, 0, -1)
            for lo in range(0, len(members), 5000):
                client.zadd(pending, dict.fromkeys(members[lo : lo + 5000], 0))
        per_master_jobs: dict[str, int] = {}
        for shard in engine.stats(Q).shards or [engine.stats(Q)]:
            master = engine.node_of(shard.queue)
            per_master_jobs[master] = per_master_jobs.get(master, 0) + shard.pending
        masters = master_clients(url, cluster)
        for m in masters.values():
            m.config_resetstat()
        cpu_before = {name: cpu_seconds(m) for name, m in masters.items()}

        ctx = multiprocessing.get_context("spawn")
        done = ctx.Value("q", 0)
        procs = [ctx.Process(target=_client, args=(url, cluster, config.shards, claim, i, done))
                 for i in range(clients)]  # fmt: skip
        started = time.perf_counter()
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        seconds = time.perf_counter() - started
        assert done.value == n, f"{config.name}: acked {done.value} of {n}"
        assert engine.stats(Q).in_flight == 0

        rows = []
        for name, m in masters.items():
            jobs = per_master_jobs.get(name, 0)
            cpu = cpu_seconds(m) - cpu_before[name]
            usec = command_usec(m)
            rows.append({
                "master": name or "(one Redis)", "jobs": jobs, "cpu_s": cpu,
                "cpu_us_per_job": cpu * 1e6 / jobs if jobs else None,
                "command_us_per_job": usec / jobs if jobs else None,
            })  # fmt: skip
            m.close()
        client.close()
    return {"config": config.name, "masters": config.masters, "shards": config.shards,
            "n": n, "clients": clients, "claim": claim, "seconds": seconds,
            "jobs_per_s": n / seconds, "per_master": rows}  # fmt: skip


def waits(samples: int = 200, idle_seconds: float = 10.0) -> list[dict[str, Any]]:
    """Wake-up latency of ``wait_for_work`` on a queue of 6 shards (a thread waits, the main
    thread adds an id due now to a random shard), and the commands an idle wait costs."""
    import random
    import statistics
    import threading

    rows = []
    for config in (Config("one Redis", 0, 6), Config("cluster of 3 masters", 3, 6)):
        cluster = config.masters > 0
        with servers(config) as url:
            engine = Engine(connect(url, cluster), prefix="bench", shards={Q: 6})
            woke: list[float] = []
            stop = threading.Event()

            def wait(engine: Engine = engine, woke: list[float] = woke, stop: Any = stop) -> None:
                while not stop.is_set():
                    if engine.wait_for_work([Q], 1.0):
                        woke.append(time.perf_counter())

            masters = master_clients(url, cluster)
            thread = threading.Thread(target=wait, daemon=True)
            thread.start()
            time.sleep(0.5)
            for m in masters.values():
                m.config_resetstat()
            time.sleep(idle_seconds)  # idle: what does waiting cost Redis?
            idle_calls = sum(
                int(v.get("calls", 0))
                for m in masters.values()
                for k, v in m.info("commandstats").items()
                if k != "cmdstat_info" and k != "cmdstat_config|resetstat"
            )
            latencies = []
            for n in range(samples):
                before = len(woke)
                sent = time.perf_counter()
                engine.add(Q, {f"w{n}-{random.random()}": 0})
                while len(woke) == before:
                    time.sleep(0.0002)
                latencies.append((woke[-1] - sent) * 1000)
                for shard in engine.shards(Q):  # empty ready again (tokens were consumed)
                    engine.claim(shard, 10, LEASE_MS)
            stop.set()
            thread.join(3)
            latencies.sort()
            rows.append({
                "redis": config.name, "samples": samples,
                "median_ms": statistics.median(latencies),
                "p99_ms": latencies[int(0.99 * (samples - 1))],
                "idle_commands_per_s": idle_calls / idle_seconds,
            })  # fmt: skip
            for m in masters.values():
                m.close()
            engine.close()
    return rows


def report_waits(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'wait_for_work on 6 shards':<28} {'median':>9} {'p99':>9} {'idle cmds/s':>12}"]
    for r in rows:
        lines.append(f"{r['redis']:<28} {r['median_ms']:>7.2f}ms {r['p99_ms']:>7.2f}ms "
                     f"{r['idle_commands_per_s']:>12.1f}")  # fmt: skip
    return "\n".join(lines)


def report(results: list[dict[str, Any]], info: dict[str, Any]) -> str:
    lines = [
        f"redis {info['redis_version']} | python {info['python']} | {info['cpus']} CPUs | "
        f"{info['platform']} | load average at start {info['load_average_1m']} | "
        f"n={results[0]['n']} ids, {results[0]['clients']} client processes, "
        f"claim {results[0]['claim']}",
        f"{'configuration':<32} {'jobs/s':>8}  {'master':<17} {'jobs':>7} "
        f"{'CPU us/job':>10} {'cmd us/job':>10} {'saturates at':>13}",
    ]
    for r in results:
        first = True
        for m in r["per_master"]:
            head = f"{r['config']:<32} {r['jobs_per_s']:>8,.0f}" if first else " " * 41
            first = False
            if not m["jobs"]:
                lines.append(f"{head}  {m['master']:<17} {0:>7}   (holds no shard of q)")
                continue
            saturation = 1e6 / m["cpu_us_per_job"]
            lines.append(
                f"{head}  {m['master']:<17} {m['jobs']:>7,} {m['cpu_us_per_job']:>10.1f} "
                f"{m['command_us_per_job']:>10.1f} {saturation:>9,.0f} j/s"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=60_000, help="ids per configuration")
    parser.add_argument("--clients", type=int, default=2, help="client processes")
    parser.add_argument("--claim", type=int, default=10, help="ids per claim call")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    with EmbeddedRedis() as probe:
        version = redis.Redis.from_url(probe.url).info("server")["redis_version"]
    info = {"redis_version": version, "python": platform.python_version(),
            "cpus": os.cpu_count(), "platform": f"{platform.system()} {platform.machine()}",
            "load_average_1m": round(os.getloadavg()[0], 2)}  # fmt: skip
    results = [run(config, args.n, args.clients, args.claim) for config in CONFIGS]
    latency = waits()
    print(report(results, info))
    print()
    print(report_waits(latency))
    if args.json:
        data = {"machine": info, "results": results, "waits": latency}
        Path(args.json).write_text(json.dumps(data, indent=2))


if __name__ == "__main__":
    main()
