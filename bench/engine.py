"""Benchmark the engine alone: add, promote, claim+ack throughput and memory per job.

    python bench/engine.py [--n 100000] [--redis-url URL] [--json PATH]

Without ``--redis-url`` it starts a private ``redis-server`` (``EmbeddedRedis``) and stops
it at the end. With one, it touches only keys under its own prefix and deletes them
afterwards (it never flushes a database), but other clients then add noise to the
memory figure. No Django settings are needed.

Ids are 36-character UUID strings, as the Django layer stores them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.engine import Engine
from django_delayjobs.engine.claims import Claimer

HOUR_MS = 3_600_000
MEMORY_TARGET_BYTES = 100
PROMOTE_TARGET_IDS_PER_S = 50_000


@contextmanager
def redis_server(url: str | None) -> Iterator[tuple[str, str]]:
    if url:
        yield url, "given"
        return
    server = EmbeddedRedis()
    try:
        yield server.start(), "embedded (unix socket)"
    finally:
        server.close()


def uuids(n: int) -> list[str]:
    return [str(uuid.uuid4()) for _ in range(n)]


def chunks(seq: list[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(seq), size):
        yield seq[i : i + size]


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class Bench:
    def __init__(self, client: redis.Redis, n: int) -> None:
        self.r = client
        self.n = n
        self.engine = Engine(client, prefix=f"bench{os.getpid()}")
        self.rows: list[dict[str, Any]] = []
        self.add_rate = 50_000.0

    # -- bookkeeping ------------------------------------------------------------------------

    def row(self, name: str, value: float, unit: str, target: str = "", ok: bool | None = None):
        self.rows.append(
            {"measure": name, "value": value, "unit": unit, "target": target, "ok": ok}
        )

    def used_memory(self) -> int:
        return int(self.r.info("memory")["used_memory"])

    def clean(self, queue: str) -> None:
        self.r.delete(*self.engine.keys(queue))

    def clean_all(self) -> None:
        keys = list(self.r.scan_iter(match=f"{{{self.engine.prefix}*", count=1000))
        for batch in chunks(keys, 1000):
            self.r.delete(*batch)

    # -- measurements ----------------------------------------------------------------------

    def add_and_memory(self) -> None:
        """Add n pending ids in batches of 1000; memory per pending job."""
        q = "mem"
        ids = uuids(self.n)
        due = self.engine.server_time_ms() + HOUR_MS
        self.r.sadd(self.engine.queues_key, q)  # so the delta is the queue's keys only
        before = self.used_memory()
        seconds = sum(
            timed(lambda b=batch: self.engine.add(q, {i: due + n for n, i in enumerate(b)}))
            for batch in chunks(ids, 1000)
        )
        after = self.used_memory()
        assert self.engine.stats(q).pending == self.n
        self.add_rate = self.n / seconds
        self.row(f"add, batches of 1000 ({self.n:,} ids)", self.add_rate, "ids/s")

        per_job = (after - before) / self.n
        self.row(
            f"memory per pending job, used_memory delta / {self.n:,}",
            per_job, "B", f"< {MEMORY_TARGET_BYTES} B", per_job < MEMORY_TARGET_BYTES,
        )  # fmt: skip
        pending = self.engine.keys(q).pending
        usage = int(self.r.memory_usage(pending, samples=0) or 0)
        encoding = self.r.object("encoding", pending)
        self.row(
            f"  of which the pending ZSET (MEMORY USAGE, {_text(encoding)})",
            usage / self.n, "B",
        )  # fmt: skip
        self.clean(q)
        self.what_if_memory()

    def what_if_memory(self) -> None:
        """Raw ZADD of other layouts, to size the alternatives (not what the engine does)."""
        due = self.engine.server_time_ms() + HOUR_MS
        tag = f"{{{self.engine.prefix}:whatif}}"
        layouts: dict[str, tuple[Callable[[], bytes | str], int]] = {
            "one ZSET, 16-byte binary ids": (lambda: uuid.uuid4().bytes, self.n),
            "128-id ZSETs (listpack), 36-char ids": (lambda: str(uuid.uuid4()), 128),
            "128-id ZSETs (listpack), 16-byte ids": (lambda: uuid.uuid4().bytes, 128),
        }
        for label, (make, per_key) in layouts.items():
            before = self.used_memory()
            members = [make() for _ in range(self.n)]
            pipe = self.r.pipeline(transaction=False)
            for start in range(0, self.n, 1000):
                for j, member in enumerate(members[start : start + 1000]):
                    pipe.zadd(f"{tag}:{(start + j) // per_key}", {member: due + start + j})
                pipe.execute()
            per_job = (self.used_memory() - before) / self.n
            del members
            self.row(f"  what-if, raw ZADD: {label}", per_job, "B")
            self.clean_all()

    def add_one_at_a_time(self, n: int = 10_000) -> None:
        q = "single"
        ids = uuids(n)
        due = self.engine.server_time_ms() + HOUR_MS
        usec, calls = self.script_time()
        seconds = sum(timed(lambda i=i: self.engine.add(q, {i: due})) for i in ids)
        self.row(f"add, one at a time ({n:,} ids)", n / seconds, "ids/s")
        usec_after, calls_after = self.script_time()
        self.row("  Redis's own time per add (INFO commandstats)",
                 (usec_after - usec) / max(calls_after - calls, 1), "us")  # fmt: skip
        self.clean(q)

    def script_time(self) -> tuple[int, int]:
        """The server's time in EVALSHA so far (microseconds) and its count of calls."""
        stats = self.r.info("commandstats").get("cmdstat_evalsha", {})
        return int(stats.get("usec", 0)), int(stats.get("calls", 0))

    def promote(self, q: str) -> None:
        """Fill pending with n ids that become due together, then time promote(1000)."""
        ids = uuids(self.n)
        # Due once all are added: three times the measured add time, plus a second.
        add_s = 3 * self.n / self.add_rate
        due = self.engine.server_time_ms() + int(add_s * 1000) + 1000
        for batch in chunks(ids, 1000):
            self.engine.add(q, dict.fromkeys(batch, due))
        while self.engine.server_time_ms() <= due:
            time.sleep(0.05)
        stats = self.engine.stats(q)
        if stats.overdue != self.n:
            raise SystemExit(f"setup failed: {stats.overdue} of {self.n} ids are overdue")

        calls: list[float] = []
        moved = 0
        start = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            result = self.engine.promote(q, batch=1000)
            calls.append(time.perf_counter() - t0)
            if not result.moved:
                break
            moved += result.moved
        seconds = time.perf_counter() - start
        assert moved == self.n
        rate = moved / seconds
        target = f">= {PROMOTE_TARGET_IDS_PER_S:,} ids/s"
        ok = rate >= PROMOTE_TARGET_IDS_PER_S
        self.row(f"promote, batch 1000 ({self.n:,} due ids)", rate, "ids/s", target, ok)
        self.row("  slowest promote call (Redis blocked)", max(calls) * 1000, "ms")
        k = self.engine.keys(q)
        # The ready LIST and, beside it, the ready_set SET that answers "is it ready?".
        usage = sum(
            int(self.r.memory_usage(key, samples=0) or 0)
            for key in (k.ready, getattr(k, "ready_set", None))
            if key
        )
        self.row("memory per ready job (ready LIST + ready_set, MEMORY USAGE)", usage / moved, "B")

    def with_a_long_ready_list(self, q: str) -> None:
        """Time add and remove with n ids ready: each must not depend on how many.

        add asks ready_set whether an id is ready and remove takes it out of that set,
        both O(1); an engine that scanned the ready LIST (LPOS/LREM) per id blocked Redis
        for about 4 ms per id with 100,000 ids ready.
        """
        ready = self.engine.stats(q).ready
        due = self.engine.server_time_ms() + HOUR_MS
        batch = uuids(100)
        seconds = timed(lambda: self.engine.add(q, dict.fromkeys(batch, due)))
        self.row(f"add 100 ids while ready holds {ready:,}", 100 / seconds, "ids/s")
        self.row("  Redis blocked by that add(100 ids)", seconds * 1000, "ms")
        more = uuids(1000)
        seconds = timed(lambda: self.engine.add(q, dict.fromkeys(more, due)))
        self.row(f"add 1000 ids while ready holds {ready:,}", 1000 / seconds, "ids/s")
        self.row("  Redis blocked by that add(1000 ids)", seconds * 1000, "ms")
        one = uuids(1)
        seconds = timed(lambda: self.engine.add(q, dict.fromkeys(one, due)))
        self.row(f"  latency of add(1 id) while ready holds {ready:,}", seconds * 1000, "ms")
        seconds = timed(lambda: self.engine.remove(q, ["not-held"]))
        self.row(f"  latency of remove(1 id not pending), ready {ready:,}", seconds * 1000, "ms")
        # Cancel ids that are ready, at the tail of the list: the case LREM was worst at.
        tail = uuids(1000)
        self.engine.add(q, dict.fromkeys(tail, 0))
        seconds = timed(lambda: self.engine.remove(q, tail))
        self.row(f"remove 1000 ready ids (one call), ready {ready + 1000:,}", seconds * 1000, "ms")
        self.engine.remove(q, batch)
        self.engine.remove(q, more)
        self.engine.remove(q, one)

    def claim_past_removed_ids(self, q: str = "tomb") -> None:
        """claim(1) behind 1000 ids removed while ready (tombstones it pops and skips)."""
        ids = uuids(1001)
        self.engine.add(q, dict.fromkeys(ids, 0))
        self.engine.remove(q, ids[:1000])
        seconds = timed(lambda: self.engine.claim(q, 1, lease_ms=HOUR_MS))
        self.row("claim(1) behind 1000 removed ready ids (Redis blocked)", seconds * 1000, "ms")
        self.clean(q)

    def claim_ack(self, q: str) -> None:
        """claim+ack; batch 10 (the worker's PREFETCH) also as the worker claims, with a
        token (``Claimer``) whose call the script records."""
        n = self.n
        runs = [(1, None, min(10_000, n // 10)), (10, None, n // 5), (10, Claimer(), n // 5),
                (100, None, n // 2)]  # fmt: skip
        for count, claimer, ids_wanted in runs:
            done = 0
            start = time.perf_counter()
            while done < ids_wanted:
                token = claimer.token(q) if claimer is not None else None
                ids = self.engine.claim(q, count, lease_ms=HOUR_MS, token=token)
                if claimer is not None:
                    claimer.answered(q)
                if not ids:
                    break
                self.engine.ack(q, ids)
                done += len(ids)
            seconds = time.perf_counter() - start
            how = ", with a claim token" if claimer is not None else ""
            self.row(f"claim+ack, batch {count}{how} ({done:,} ids)", done / seconds, "ids/s")

    def run(self) -> None:
        try:
            self.add_and_memory()
            self.add_one_at_a_time()
            self.promote("flow")
            self.with_a_long_ready_list("flow")
            self.claim_ack("flow")
            self.claim_past_removed_ids()
        finally:
            self.clean_all()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def machine(client: redis.Redis, how: str) -> dict[str, Any]:
    server = client.info("server")
    memory = client.info("memory")
    return {
        "redis_version": server["redis_version"],
        "redis_allocator": memory.get("mem_allocator", "?"),
        "redis": how,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": f"{platform.system()} {platform.machine()}",
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def fmt(row: dict[str, Any]) -> str:
    value = row["value"]
    shown = f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"
    verdict = ""
    if row["ok"] is not None:
        verdict = "ok" if row["ok"] else "MISSED"
    return f"{row['measure']:<58} {shown:>12} {row['unit']:<6} {row['target']:<17} {verdict}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="ids per bulk measurement")
    parser.add_argument("--redis-url", help="use this Redis instead of a private one")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if args.n < 1000:
        parser.error("--n must be at least 1000")

    with redis_server(args.redis_url) as (url, how):
        # No socket timeout: a slow script is a result to report, not an error.
        client = redis.Redis.from_url(url, socket_timeout=None)
        try:
            info = machine(client, how)
            bench = Bench(client, args.n)
            bench.run()
        finally:
            client.close()

    print(
        f"redis {info['redis_version']} ({info['redis_allocator']}, {info['redis']}) | "
        f"python {info['python']} | {info['cpus']} CPUs | {info['platform']} | "
        f"load average at start {info['load_average_1m']}"
    )
    print(f"{'measure':<58} {'value':>12} {'unit':<6} {'target':<17}")
    for row in bench.rows:
        print(fmt(row))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "results": bench.rows}, indent=2))


if __name__ == "__main__":
    main()
