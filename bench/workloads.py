"""The workloads of ``compare.py`` (W1-W5) and the harness they run in.

One ``Run`` is one system on one private Redis. Every job records its own start time in
that Redis (``peers/common.py``), so lateness is measured by the job, not by a log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
from peers import common

W4_SPAN = 5.0
PREFILL_BUDGET = 300.0  # seconds; a W4 size whose prefill would take longer is not run
WARMUP_TIMEOUT = 120.0
# W5: (worker threads per process, worker processes), one thread in one process first:
# the rows issue 18 asks for (--concurrency 1, 2, 4, and 2 processes).
SCALING = [(1, 1), (2, 1), (4, 1), (1, 2)]


class Failed(Exception):
    """The system could not cope; the message says what happened."""


class Run:
    """One system on one private Redis."""

    def __init__(self, adapter: common.Adapter, client: redis.Redis, workdir: Path) -> None:
        self.adapter = adapter
        self.r = client
        self.workdir = workdir
        # Scheduling rates (jobs/s), refined by W1; they set how far ahead W2-W5 start.
        self.rate = 300.0
        self.batch_rate = 1000.0

    def clean(self) -> None:
        self.r.flushall()
        self.adapter.reset()

    def used_memory(self) -> int:
        return int(self.r.info("memory")["used_memory"])

    def schedule(self, items: list[tuple[str, float]], batch: bool = False) -> float:
        start = time.perf_counter()
        if batch:
            self.adapter.schedule_batch(items)
        else:
            for job_id, due in items:
                self.adapter.schedule(job_id, due)
        return time.perf_counter() - start

    def prefill(self, items: list[tuple[str, float]]) -> float:
        start = time.perf_counter()
        self.adapter.prefill(items)
        return time.perf_counter() - start

    def lead(self, n: int, batch: bool = False) -> float:
        """Seconds ahead to put the first due time so that scheduling n jobs ends before it
        (twice the time W1's rate predicts: on a loaded machine the rate drops, and a
        schedule that ends late spoils the figure; the report then says so)."""
        return n / (self.batch_rate if batch else self.rate) * 2 + 2

    def results(self) -> list[tuple[str, float, float]]:
        return [tuple(json.loads(x)) for x in self.r.lrange(common.RESULTS_KEY, 0, -1)]

    def wait_for(self, n: int, deadline: float) -> None:
        while self.r.llen(common.RESULTS_KEY) < n and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # let stragglers (duplicates) land

    @contextmanager
    def worker(
        self, label: str, cmd: list[str] | None = None, processes: int = 1
    ) -> Iterator[None]:
        """Start ``processes`` copies of the worker command (the adapter's by default) and
        yield once a job due now has run and every process is up; stop them all after."""
        started: list[tuple[subprocess.Popen[bytes], Path]] = []
        try:
            for n in range(processes):
                log = self.workdir / f"worker-{label}-{n}.log"
                started.append((self.start(cmd or self.adapter.worker_cmd(), log), log))
            self.warm_up(started, processes)
            yield
        finally:
            for proc, _ in started:
                stop(proc)

    def start(self, cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            return subprocess.Popen(
                cmd,
                cwd=self.workdir,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=os.environ.copy(),
            )

    def warm_up(self, started: list[tuple[subprocess.Popen[bytes], Path]], processes: int) -> None:
        self.adapter.schedule("warmup", time.time())
        deadline = time.time() + WARMUP_TIMEOUT
        while True:
            live = self.adapter.live_workers()
            if self.r.llen(common.RESULTS_KEY) and (live is None or live >= processes):
                break
            for proc, log in started:
                if proc.poll() is not None or time.time() > deadline:
                    what = "exited" if proc.poll() is not None else "did not run a job due now"
                    if live is not None and live < processes:
                        what += f" ({live} of {processes} processes up)"
                    tail = log.read_text(errors="replace")[-600:]
                    raise Failed(f"worker {what} within {WARMUP_TIMEOUT:.0f} s; log: {tail}")
            time.sleep(0.05)
        self.r.delete(common.RESULTS_KEY)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the worker's own process group, SIGKILL it after 10 s."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def lateness(records: list[tuple[str, float, float]], expected: set[str]) -> dict[str, Any]:
    seen = Counter(job_id for job_id, _, _ in records)
    first: dict[str, float] = {}
    for job_id, due, started in records:
        first.setdefault(job_id, (started - due) * 1000)
    late = [first[i] for i in expected if i in first]
    out: dict[str, Any] = {
        "ran": len(late),
        "early": sum(1 for x in late if x < 0),
        "missing": len(expected) - len(late),
        "duplicated": sum(c - 1 for i, c in seen.items() if i in expected and c > 1),
    }
    if late:
        out |= {f"p{p}_ms": pct(late, p) for p in (50, 90, 99)} | {"max_ms": max(late)}
    return out


def grace(n: int) -> float:
    return max(30.0, n / 40)


def w1(run: Run, n: int) -> dict[str, Any]:
    """Schedule n jobs due in an hour, no worker running: jobs/s and Redis bytes per job."""
    variants = [("one at a time", False)] + ([("batch API", True)] if run.adapter.has_batch else [])
    out: dict[str, Any] = {}
    for label, batch in variants:
        run.clean()
        due = time.time() + 3600
        items = [(f"w1-{i}", due) for i in range(n)]
        before = run.used_memory()
        seconds = run.schedule(items, batch=batch)
        out[label] = {
            "n": n,
            "jobs_per_s": n / seconds,
            "redis_bytes_per_job": (run.used_memory() - before) / n,
        }
        if batch:
            run.batch_rate = n / seconds
        else:
            run.rate = n / seconds
    return out


def w2(run: Run, n: int, span: float) -> dict[str, Any]:
    """n jobs due uniformly over span seconds: their lateness."""
    run.clean()
    with run.worker("w2"):
        t0 = time.time() + run.lead(n)
        items = [(f"w2-{i}", t0 + span * i / n) for i in range(n)]
        run.schedule(items)
        behind = time.time() - t0
        run.wait_for(n, items[-1][1] + grace(n))
        out = lateness(run.results(), {i for i, _ in items})
    out |= {"n": n, "span_s": span}
    if behind > 0:
        out["harness_note"] = f"scheduling ended {behind:.2f} s after the first due time"
    return out


def drain(run: Run, items: list[tuple[str, float]], due: float) -> dict[str, Any]:
    """Wait for jobs all due at ``due`` (just scheduled) and measure the drain rate: jobs/s
    from the due time until the last one started."""
    behind = time.time() - due
    start = max(due, time.time())
    n = len(items)
    run.wait_for(n, start + grace(n))
    records = run.results()
    out = lateness(records, {i for i, _ in items})
    last = max((s for _, _, s in records), default=start)
    out |= {"n": n, "jobs_per_s": out["ran"] / max(last - start, 1e-3)}
    if behind > 0:
        out["harness_note"] = f"scheduling ended {behind:.2f} s after the due time"
    if out["missing"]:
        out["note"] = f"{out['missing']} of {n} had not run {grace(n):.0f} s after the due time"
    return out


def w3(run: Run, n: int) -> dict[str, Any]:
    """n jobs due at the same moment, scheduled one at a time: the drain rate."""
    run.clean()
    with run.worker("w3"):
        due = time.time() + run.lead(n)
        items = [(f"w3-{i}", due) for i in range(n)]
        run.schedule(items)
        return drain(run, items, due)


def w4(run: Run, sizes: list[int], k: int) -> dict[str, Any]:
    """With m jobs pending a day out (for each size m): Redis bytes per pending job, then
    the schedule rate and lateness of k near-term jobs."""
    out: dict[str, Any] = {}
    prefill_rate, failed_at = None, None
    for m in sizes:
        if failed_at is not None:
            out[str(m)] = {"skipped": f"not run: failed with {failed_at:,} pending"}
            continue
        if prefill_rate and m / prefill_rate > PREFILL_BUDGET:
            out[str(m)] = {
                "skipped": f"not run: prefilling {m:,} at the {prefill_rate:,.0f}/s measured "
                f"would take {m / prefill_rate / 60:.0f} min (harness budget "
                f"{PREFILL_BUDGET / 60:.0f} min)"
            }
            continue
        run.clean()
        far = time.time() + 86_400
        before = run.used_memory()
        seconds = run.prefill([(f"far-{i}", far) for i in range(m)])
        prefill_rate = m / seconds
        row: dict[str, Any] = {
            "prefill_jobs_per_s": prefill_rate,
            "redis_bytes_per_pending": (run.used_memory() - before) / m,
        }
        try:
            with run.worker(f"w4-{m}"):
                t0 = time.time() + run.lead(k)
                items = [(f"w4-{i}", t0 + W4_SPAN * i / k) for i in range(k)]
                row["jobs_per_s"] = k / run.schedule(items)
                if (behind := time.time() - t0) > 0:
                    row["harness_note"] = (
                        f"scheduling ended {behind:.2f} s after the first due time"
                    )
                run.wait_for(k, items[-1][1] + grace(k))
                row |= lateness(run.results(), {i for i, _ in items})
        except Failed as exc:  # the prefill's figures stay: they were measured
            row["failed"], failed_at = str(exc), m
        out[str(m)] = row
    return out


def scaling_label(threads: int, processes: int) -> str:
    if processes == 1:
        return f"1 process, --concurrency {threads}"
    return f"{processes} processes, --concurrency {threads} each"


def w5(run: Run, n: int) -> dict[str, Any]:
    """The drain rate with more workers (delayjobs only): n jobs due at the same moment,
    scheduled with the batch API, for each (threads, processes) of ``SCALING``."""
    out: dict[str, Any] = {}
    for threads, processes in SCALING:
        run.clean()
        try:
            cmd = run.adapter.worker_cmd(concurrency=threads)
            with run.worker(f"w5-{threads}x{processes}", cmd, processes):
                due = time.time() + run.lead(n, batch=True)
                items = [(f"w5-{i}", due) for i in range(n)]
                run.schedule(items, batch=True)
                row = drain(run, items, due)
        except Failed as exc:
            row = {"failed": str(exc)}
        out[scaling_label(threads, processes)] = row | {"threads": threads, "processes": processes}
    return out
