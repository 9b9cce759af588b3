"""Run the same delayed-job workloads on delayjobs, Celery, RQ, Huey and Dramatiq.

    python bench/compare.py [--quick] [--systems delayjobs,celery,rq,huey,dramatiq]
                            [--workloads W1,W2,W3,W4] [--database-url URL] [--out bench/results/]

Run it with the interpreter of the venv that holds ``bench/requirements.txt``. One system
at a time, each on a fresh private ``redis-server`` (``EmbeddedRedis``, unix socket) that
is flushed between workloads and stopped at the end, with one worker process. Every job
records its own start time in that Redis (see ``peers/common.py``).

W1 schedule N jobs due in 1 h from this process (no worker running): jobs/s, and Redis
   ``used_memory`` delta / N.
W2 N jobs due uniformly over T s: lateness (start - due) p50/p90/p99/max, early, missing,
   duplicated runs.
W3 N jobs due at the same moment: jobs/s from the due time until the last one started.
W4 with M jobs already pending 1 day out (scheduled before the worker starts, with the
   system's fastest way: its batch API, else one at a time): schedule rate and lateness of
   K near-term jobs. A size whose prefill would take over PREFILL_BUDGET at the rate the
   previous size's prefill ran, or that follows a failed size, is reported as not run.

Writes ``compare-<stamp>.json`` and ``compare-<stamp>.md`` (and ``latest.*``) to --out.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

import redis  # noqa: E402
from peers import SYSTEMS, common  # noqa: E402

from django_delayjobs.embedded import EmbeddedRedis  # noqa: E402

FULL = {
    "w1": 20_000,
    "w2": 3_000,
    "w2_span": 10.0,
    "w3": 20_000,
    "w4": [1_000, 100_000, 1_000_000],
    "w4_jobs": 2_000,
}
QUICK = {"w1": 2_000, "w2": 500, "w2_span": 5.0, "w3": 2_000, "w4": [1_000, 10_000], "w4_jobs": 500}
W4_SPAN = 5.0
PREFILL_BUDGET = 300.0  # seconds; a W4 size whose prefill would take longer is not run
WARMUP_TIMEOUT = 120.0


class Failed(Exception):
    """The system could not cope; the message says what happened."""


class Run:
    """One system on one private Redis."""

    def __init__(self, adapter: common.Adapter, client: redis.Redis, workdir: Path) -> None:
        self.adapter = adapter
        self.r = client
        self.workdir = workdir
        self.rate = 300.0  # schedule jobs/s, refined by W1; sets how far ahead W2-W4 start

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

    def lead(self, n: int) -> float:
        """Seconds ahead to put the first due time so that scheduling n jobs ends before it."""
        return n / self.rate * 1.5 + 1.5

    def results(self) -> list[tuple[str, float, float]]:
        return [tuple(json.loads(x)) for x in self.r.lrange(common.RESULTS_KEY, 0, -1)]

    def wait_for(self, n: int, deadline: float) -> None:
        while self.r.llen(common.RESULTS_KEY) < n and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # let stragglers (duplicates) land

    @contextmanager
    def worker(self, label: str) -> Iterator[None]:
        log = self.workdir / f"worker-{label}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                self.adapter.worker_cmd(),
                cwd=self.workdir,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=os.environ.copy(),
            )
        try:
            self.adapter.schedule("warmup", time.time())
            deadline = time.time() + WARMUP_TIMEOUT
            while not self.r.llen(common.RESULTS_KEY):
                if proc.poll() is not None or time.time() > deadline:
                    what = "exited" if proc.poll() is not None else "did not run a job due now"
                    tail = log.read_text(errors="replace")[-600:]
                    raise Failed(f"worker {what} within {WARMUP_TIMEOUT:.0f} s; log: {tail}")
                time.sleep(0.05)
            self.r.delete(common.RESULTS_KEY)
            yield
        finally:
            stop(proc)


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


# -- workloads --------------------------------------------------------------------------


def w1(run: Run, n: int) -> dict[str, Any]:
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
        if not batch:
            run.rate = n / seconds
    return out


def w2(run: Run, n: int, span: float) -> dict[str, Any]:
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


def w3(run: Run, n: int) -> dict[str, Any]:
    run.clean()
    with run.worker("w3"):
        due = time.time() + run.lead(n)
        items = [(f"w3-{i}", due) for i in range(n)]
        run.schedule(items)
        start = max(due, time.time())
        run.wait_for(n, start + grace(n))
        records = run.results()
    out = lateness(records, {i for i, _ in items})
    last = max((s for _, _, s in records), default=start)
    out |= {"n": n, "jobs_per_s": out["ran"] / max(last - start, 1e-3)}
    if out["missing"]:
        out["note"] = f"{out['missing']} of {n} had not run {grace(n):.0f} s after the due time"
    return out


def w4(run: Run, sizes: list[int], k: int) -> dict[str, Any]:
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
        try:
            far = time.time() + 86_400
            seconds = run.prefill([(f"far-{i}", far) for i in range(m)])
            prefill_rate = m / seconds
            row: dict[str, Any] = {"prefill_jobs_per_s": prefill_rate}
            with run.worker(f"w4-{m}"):
                t0 = time.time() + run.lead(k)
                items = [(f"w4-{i}", t0 + W4_SPAN * i / k) for i in range(k)]
                row["jobs_per_s"] = k / run.schedule(items)
                run.wait_for(k, items[-1][1] + grace(k))
                row |= lateness(run.results(), {i for i, _ in items})
        except Failed as exc:
            row, failed_at = {"failed": str(exc)}, m
        out[str(m)] = row
    return out


# -- driver -----------------------------------------------------------------------------


def run_system(name: str, args: argparse.Namespace, sizes: dict[str, Any]) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    server = EmbeddedRedis(workdir / "redis")
    result: dict[str, Any] = {"system": name}
    try:
        url = server.start()
        os.environ["BENCH_REDIS_URL"] = url
        os.environ["BENCH_SQLITE_PATH"] = str(workdir / "bench.sqlite3")
        if args.database_url:
            os.environ["BENCH_DATABASE_URL"] = args.database_url
        os.environ["PYTHONPATH"] = os.pathsep.join([str(BENCH), str(BENCH.parent)])
        adapter = importlib.import_module(SYSTEMS[name]).Adapter()
        client = redis.Redis.from_url(url)
        result |= {
            "versions": adapter.versions(),
            "settings": adapter.settings,
            "redis": client.info("server")["redis_version"],
        }
        run = Run(adapter, client, workdir)
        plan = {
            "W1": lambda: w1(run, sizes["w1"]),
            "W2": lambda: w2(run, sizes["w2"], sizes["w2_span"]),
            "W3": lambda: w3(run, sizes["w3"]),
            "W4": lambda: w4(run, sizes["w4"], sizes["w4_jobs"]),
        }
        for workload in args.workloads:
            print(f"  {name} {workload} ...", flush=True)
            started = time.time()
            try:
                result[workload] = plan[workload]()
            except Exception as exc:  # report, don't crash the harness
                result[workload] = {"failed": f"{type(exc).__name__}: {exc}"[:800]}
            result[workload]["seconds"] = round(time.time() - started, 1)
            print(f"  {name} {workload}: {json.dumps(result[workload])[:300]}", flush=True)
    except Exception as exc:
        result["failed"] = f"{type(exc).__name__}: {exc}"[:800]
    finally:
        server.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def postgres_w1(args: argparse.Namespace) -> dict[str, Any]:
    """delayjobs W1 with the audit rows on PostgreSQL, in a process of its own (Django's
    settings are fixed once set up)."""
    print("delayjobs (PostgreSQL):", flush=True)
    with tempfile.TemporaryDirectory() as out:
        command = [
            sys.executable, __file__, "--systems", "delayjobs", "--workloads", "W1",
            "--database-url", args.also_postgres, "--out", out,
        ]  # fmt: skip
        subprocess.run(command + (["--quick"] if args.quick else []), check=True)
        (result,) = json.loads((Path(out) / "latest.json").read_text())["systems"]
    return result | {"system": "delayjobs (PostgreSQL)"}


def machine() -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg()[0],
    }


# -- report -----------------------------------------------------------------------------


def fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def late_cells(d: dict[str, Any]) -> list[str]:
    if "skipped" in d:
        return [d["skipped"]] + [""] * 7
    if "failed" in d:
        failed = d["failed"].split("; log: ")[0][:120].replace("|", "/").replace("\n", " ")
        return ["failed: " + failed] + [""] * 7
    return [fmt(d.get(k), 1) for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms")] + [
        fmt(d.get(k)) for k in ("ran", "early", "missing", "duplicated")
    ]


def section(title: str, header: str, rows: list[str]) -> list[str]:
    if not rows:
        return []
    columns = header.count("|") - 1
    return ["", title, "", header, "|---" + "|--:" * (columns - 1) + "|", *rows]


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    systems = report["systems"]
    lines = [
        f"{'Quick run' if report['quick'] else 'Full run'}, {m['date']}, {m['cpus']} CPUs, "
        f"{m['platform']}, Python {m['python']}, load average at start "
        f"{m['load_average_at_start']:.2f}. Sizes: {json.dumps(report['sizes'])}."
    ]
    rows = []
    for s in systems:
        w = s.get("W1", {})
        if "failed" in w:
            rows.append(f"| {s['system']} | | failed: {w['failed'][:160]} | |")
        for api, d in w.items():
            if isinstance(d, dict):
                rows.append(
                    f"| {s['system']} | {api} | {fmt(d['jobs_per_s'])} "
                    f"| {fmt(d['redis_bytes_per_job'])} |"
                )
    lines += section(
        "W1: schedule N jobs due in 1 h, from one process, no worker running",
        "| system | API | jobs/s | Redis B/job |",
        rows,
    )
    head = "| p50 ms | p90 ms | p99 ms | max ms | ran | early | missing | dup |"
    rows = [
        f"| {s['system']} | " + " | ".join(late_cells(s["W2"])) + " |" for s in systems if "W2" in s
    ]
    lines += section("W2: lateness, jobs due uniformly over the span", "| system " + head, rows)
    rows = []
    for s in systems:
        d = s.get("W3")
        if d is None:
            continue
        if "failed" in d:
            rows.append(f"| {s['system']} | failed: {d['failed'][:160]} |||||||")
            continue
        rows.append(
            f"| {s['system']} | {fmt(d.get('jobs_per_s'))} | {fmt(d.get('ran'))} "
            f"| {fmt(d.get('missing'))} | {fmt(d.get('duplicated'))} | {fmt(d.get('p50_ms'), 1)} "
            f"| {fmt(d.get('p99_ms'), 1)} | {fmt(d.get('max_ms'), 1)} |"
        )
    lines += section(
        "W3: drain, N jobs due at the same moment (jobs/s from the due time)",
        "| system | jobs/s | ran | missing | dup | p50 ms | p99 ms | max ms |",
        rows,
    )
    rows = []
    for s in systems:
        w4 = s.get("W4", {})
        if "failed" in w4:
            rows.append(f"| {s['system']} | | failed: {w4['failed'][:160]} |||||||||")
        for m_pending, d in w4.items():
            if isinstance(d, dict):
                rows.append(
                    f"| {s['system']} | {fmt(int(m_pending))} | {fmt(d.get('jobs_per_s'))} | "
                    + " | ".join(late_cells(d))
                    + " |"
                )
    lines += section(
        "W4: with M jobs pending 1 day out, K near-term jobs scheduled one at a time",
        "| system | M pending | schedule jobs/s " + head,
        rows,
    )
    lines += ["", "Versions and settings", ""]
    for s in systems:
        versions = ", ".join(f"{k} {v}" for k, v in s.get("versions", {}).items())
        settings = "; ".join(f"{k}: {v}" for k, v in s.get("settings", {}).items())
        failed = f" FAILED: {s['failed']}" if "failed" in s else ""
        lines.append(
            f"- **{s['system']}** ({versions}; Redis {s.get('redis', '?')}): {settings}" + failed
        )
    notes = [
        f"- {s['system']} {w}: {s[w][k]}"
        for s in systems
        for w in ("W2", "W3")
        if isinstance(s.get(w), dict)
        for k in ("harness_note", "note")
        if k in s[w]
    ]
    return "\n".join(lines + (["", "Notes", "", *notes] if notes else [])) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, a few minutes")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--workloads", default="W1,W2,W3,W4")
    parser.add_argument("--database-url", help="delayjobs audit rows there instead of SQLite")
    parser.add_argument(
        "--also-postgres",
        metavar="URL",
        help="add a 'delayjobs (PostgreSQL)' W1 row: audit rows in this (emptied) database",
    )
    parser.add_argument("--out", default=str(BENCH / "results"))
    parser.add_argument("--render", metavar="JSON", help="only re-render a report as Markdown")
    args = parser.parse_args()
    if args.render:
        print(markdown(json.loads(Path(args.render).read_text())))
        return
    args.workloads = [w.strip().upper() for w in args.workloads.split(",")]
    sizes = QUICK if args.quick else FULL
    report: dict[str, Any] = {
        "quick": args.quick,
        "sizes": sizes,
        "machine": machine(),
        "systems": [],
    }
    for name in args.systems.split(","):
        print(f"{name}:", flush=True)
        report["systems"].append(run_system(name.strip(), args, sizes))
        if name.strip() == "delayjobs" and args.also_postgres:
            report["systems"].append(postgres_w1(args))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
    text = markdown(report)
    for stem in (f"compare-{stamp}", "latest"):
        (out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
        (out / f"{stem}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
