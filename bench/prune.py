"""Lateness of due jobs while ``delayjobs_prune`` deletes 1,000,000 old jobs (PostgreSQL).

    python bench/prune.py [--database-url postgres://postgres@127.0.0.1:5432/prune_bench]
                          [--n 1000000] [--jobs 2000] [--span 20] [--batch N] [--max-rate JOBS]
                          [--concurrency N] [--alternate SECONDS] [--statement-log PATH]
                          [--quick] [--alone] [--out out.json]

The database given is the bench's own (created if missing): its job and event tables
are emptied first.

1. Fixtures: N finished jobs (90% succeeded, 7% cancelled, 3% skipped: the statuses
   ``delayjobs_prune`` deletes by default), finished 31 to 366 days ago, with their
   events (scheduled, started, succeeded; or scheduled and cancelled/skipped: 2.9 per job
   on average), inserted with two ``INSERT ... SELECT`` statements over
   ``generate_series`` (table and column names from the models' ``_meta``), then
   ``VACUUM ANALYZE`` and ``CHECKPOINT``, so that neither run pays for the inserts.
2. One ``run_delayworker`` process (``--concurrency`` threads, 1 by default) on a private
   ``redis-server`` (the bench's settings, ``peers/dj_settings.py``), warmed up with one
   job due now.
3. Run (a), no pruning: ``--jobs`` jobs due uniformly over ``--span`` seconds
   (``schedule_many`` in chunks of 1,000, as compare.py's batch path); each job records
   its own start time in Redis (``peers/common.py``); lateness = start - due.
4. Run (b), the same windows while ``manage.py delayjobs_prune --older-than 30d`` (with
   ``--max-rate`` and ``--batch`` when given, else the command's defaults: 1,000 jobs/s
   in batches of 50) runs as a subprocess, started 1 s before the first due time. While
   the prune is still running at the end of a window, another window is scheduled and
   run, until it exits. The lateness compared with (a) is that of the jobs due while the
   prune was running.
5. Run (c), one window again without pruning, after it: how far the machine itself moved
   between (a) and (b).

``--alternate SECONDS`` makes (b) an A/B run under the same conditions: the prune is
stopped (SIGSTOP) and continued (SIGCONT) every SECONDS, and the lateness of the jobs due
while it ran is compared with that of the jobs due while it was stopped, leaving out the
first second after each switch. On a virtual machine whose host takes CPU time away
unevenly ("steal" in /proc/stat, reported for every run), runs minutes apart are not
comparable to within 20%; interleaved halves of one run are.

``--statement-log PATH`` (PATH: the server's log file, on this machine) has the server log
every statement's duration for the run and reports the worker's statements (claim and
outcome UPDATEs, event INSERTs, the claim's and the outcome's COMMIT) by phase, the
prune busy or idle in (b): which of the worker's statements the prune slows down
(``pglog.py``).

``--alone`` runs only the prune, with no worker and no windows: its speed, and the CPU
time of the command's own process.

Reported: the prune's wall time (process start to exit, Django's start-up included), jobs
and events deleted per second, the command's CPU time, the WAL the server wrote meanwhile
(all its databases) and its checkpoints, lateness p50/p90/p99/max of each run, the ratio
of the p99s (issue 16's target: (b) at most 1.2 times (a)), what the active backends of
the database waited on (``pg_stat_activity`` sampled every 0.25 s, the prune's queries
apart), the load average at the start and the end, versions.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(ROOT)]

import pglog  # noqa: E402

from django_delayjobs.embedded import EmbeddedRedis  # noqa: E402

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/prune_bench"
TARGET_RATIO = 1.2
#: delayjobs_prune's last line: jobs, events and batches deleted.
SUMMARY = re.compile(r"deleted (\d+) .* with (\d+) event\(s\), in (\d+) batch")

INSERT_JOBS = """
INSERT INTO {job} ({id}, {queue}, {action}, {target_type}, {target_id}, {args}, {kwargs},
                   {key}, {run_at}, {expires_at}, {status}, {attempts}, {max_attempts},
                   {deliveries}, {priority}, {worker}, {created_at}, {started_at},
                   {finished_at}, {last_error}, {result})
SELECT gen_random_uuid(), 'default', 'shop.tasks.send_receipt', NULL, NULL,
       jsonb_build_array(g), '{{}}'::jsonb, NULL,
       s.fin - interval '1 second', NULL, s.status,
       CASE WHEN s.status = 'succeeded' THEN 1 ELSE 0 END, 5,
       CASE WHEN s.status = 'succeeded' THEN 1 ELSE 0 END, 0,
       CASE WHEN s.status = 'succeeded' THEN 'bench-worker' ELSE '' END,
       s.fin - interval '1 hour',
       CASE WHEN s.status = 'succeeded' THEN s.fin - interval '50 milliseconds' END,
       s.fin, '',
       CASE WHEN s.status = 'succeeded' THEN '"ok"'::jsonb END
FROM generate_series(1, %(n)s) AS g
CROSS JOIN LATERAL (
  SELECT now() - interval '31 days' - (g::float / %(n)s) * interval '335 days' AS fin,
         CASE WHEN mod(g, 100) < 90 THEN 'succeeded'
              WHEN mod(g, 100) < 97 THEN 'cancelled' ELSE 'skipped' END AS status
) AS s
"""

INSERT_EVENTS = """
INSERT INTO {event} ({ev_job}, {ev_kind}, {ev_at}, {ev_attempt}, {ev_actor}, {ev_message})
SELECT j.{id}, e.kind, e.at, e.attempt, e.actor, ''
FROM {job} AS j
CROSS JOIN LATERAL (VALUES
  ('scheduled', j.{created_at}, 0, 'code'),
  (CASE WHEN j.{status} = 'succeeded' THEN 'started' END, j.{started_at}, 1,
   'worker:bench-worker'),
  (j.{status}, j.{finished_at}, j.{attempts},
   CASE WHEN j.{status} = 'succeeded' THEN 'worker:bench-worker' ELSE 'code' END)
) AS e(kind, at, attempt, actor)
WHERE e.kind IS NOT NULL
"""


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def summary(late: list[float]) -> dict[str, Any]:
    if not late:
        return {"jobs": 0}
    out: dict[str, Any] = {"jobs": len(late), "early": sum(1 for x in late if x < 0)}
    out |= {f"p{p}_ms": round(pct(late, p), 1) for p in (50, 90, 99)}
    return out | {"max_ms": round(max(late), 1)}


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class Steal:
    """The share of CPU time the hypervisor gave to others ("steal" in /proc/stat) since
    the last ``take()``; None where /proc/stat has no such column."""

    def __init__(self) -> None:
        self.last = self.read()

    @staticmethod
    def read() -> list[int] | None:
        try:
            fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        except OSError:
            return None
        return [int(x) for x in fields] if len(fields) >= 8 else None

    def take(self) -> float | None:
        now, last = self.read(), self.last
        self.last = now
        if now is None or last is None:
            return None
        delta = [a - b for a, b in zip(now, last, strict=False)]
        return round(100 * delta[7] / max(1, sum(delta[:8])), 1)


class Alternate(threading.Thread):
    """Stops and continues the prune process every ``period`` s until it exits."""

    def __init__(self, process: subprocess.Popen[bytes], period: float) -> None:
        super().__init__(daemon=True)
        self.process = process
        self.period = period
        self.switches: list[tuple[float, bool]] = [(time.time(), True)]  # (when, running)

    def run(self) -> None:
        running = True
        try:
            while self.process.poll() is None:
                time.sleep(self.period)
                running = not running
                with contextlib.suppress(ProcessLookupError):
                    self.process.send_signal(signal.SIGCONT if running else signal.SIGSTOP)
                self.switches.append((time.time(), running))
        finally:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGCONT)

    def running_at(self, t: float, settle: float = 1.0) -> bool | None:
        """Whether the prune ran at ``t``; None within ``settle`` s after a switch."""
        state = None
        for when, running in self.switches:
            if when > t:
                break
            state = None if t - when < settle else running
        return state


def fixtures(n: int) -> dict[str, Any]:
    from django.db import connection

    from django_delayjobs.models import Job, JobEvent

    qn = connection.ops.quote_name
    names = {"job": qn(Job._meta.db_table), "event": qn(JobEvent._meta.db_table)}
    names |= {f.name: qn(f.column) for f in Job._meta.concrete_fields}
    names |= {f"ev_{f.name}": qn(f.column) for f in JobEvent._meta.concrete_fields}
    out: dict[str, Any] = {}
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {names['event']}, {names['job']}")
        t0 = time.perf_counter()
        cursor.execute(INSERT_JOBS.format(**names), {"n": n})
        out["insert_jobs_s"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        cursor.execute(INSERT_EVENTS.format(**names))
        out["events"] = cursor.rowcount
        out["insert_events_s"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        cursor.execute(f"VACUUM ANALYZE {names['job']}")
        cursor.execute(f"VACUUM ANALYZE {names['event']}")
        cursor.execute("CHECKPOINT")
        out["vacuum_analyze_checkpoint_s"] = round(time.perf_counter() - t0, 1)
        cursor.execute(
            "SELECT pg_size_pretty(pg_total_relation_size(%s)), "
            "pg_size_pretty(pg_total_relation_size(%s))",
            [Job._meta.db_table, JobEvent._meta.db_table],
        )
        out["job_table_size"], out["event_table_size"] = cursor.fetchone()
    out["jobs"] = n
    return out


class Bench:
    def __init__(self, adapter: Any, client: Any, jobs: int, span: float) -> None:
        self.adapter = adapter
        self.r = client
        self.jobs = jobs
        self.span = span
        self.windows = 0
        self.expected = 0  # jobs scheduled so far (each records one start)
        self.notes: list[str] = []

    def schedule_window(self, lead: float) -> tuple[float, list[tuple[str, float]]]:
        """Schedule one window of jobs, the first due ``lead`` s from now."""
        self.windows += 1
        t0 = time.time() + lead
        items = [(f"w{self.windows}-{i}", t0 + self.span * i / self.jobs)
                 for i in range(self.jobs)]  # fmt: skip
        self.adapter.schedule_batch(items)
        behind = time.time() - t0
        if behind > 0:
            self.notes.append(f"window {self.windows}: scheduling ended {behind:.2f} s "
                              "after its first due time")  # fmt: skip
        return t0, items

    def lead(self) -> float:
        return self.jobs / 500 + 2  # schedule_many manages 1,000 to 3,000 jobs/s here

    def wait(self, items: list[tuple[str, float]]) -> None:
        """Until every job of ``items`` has recorded its start (or 60 s after the last due)."""
        self.expected += len(items)
        deadline = items[-1][1] + 60
        while time.time() < deadline:
            if self.r.llen("bench:results") >= self.expected:
                return
            time.sleep(0.2)
        self.notes.append(f"window {self.windows}: not every job had run 60 s after its last due")

    def results(self) -> dict[str, tuple[float, float]]:
        """job id -> (due, started), the first start of each."""
        out: dict[str, tuple[float, float]] = {}
        for raw in self.r.lrange("bench:results", 0, -1):
            job_id, due, started = json.loads(raw)
            out.setdefault(job_id, (due, started))
        return out


class Waits(threading.Thread):
    """Samples pg_stat_activity every 0.25 s: what the active backends of the bench's
    database wait on, the prune's (its queries delete or skip locked rows) apart."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        import dj_database_url
        import psycopg

        db = dj_database_url.parse(url)
        self.conn = psycopg.connect(
            dbname=db["NAME"], user=db["USER"], password=db["PASSWORD"] or None,
            host=db["HOST"] or None, port=db["PORT"] or None, autocommit=True,
        )  # fmt: skip
        self.counts: Counter[str] = Counter()
        self.samples = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.25):
            rows = self.conn.execute(
                "SELECT query, coalesce(wait_event_type || ':' || wait_event, 'CPU') "
                "FROM pg_stat_activity WHERE datname = current_database() "
                "AND state = 'active' AND pid <> pg_backend_pid()"
            ).fetchall()
            self.samples += 1
            for query, wait in rows:
                who = "prune" if ("SKIP LOCKED" in query or "DELETE" in query) else "other"
                self.counts[f"{who} {wait}"] += 1

    def wal(self) -> tuple[int, int]:
        """Bytes of WAL written so far (by the whole server) and checkpoints so far."""
        row = self.conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, "
            "checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
        ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def take(self) -> dict[str, Any]:
        out = {"samples": self.samples, **dict(self.counts.most_common(8))}
        self.counts.clear()
        self.samples = 0
        return out


def run_prune(
    env: dict[str, str], log: Path, max_rate: int | None, batch: int | None
) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "django", "delayjobs_prune", "--older-than", "30d"]
    if max_rate is not None:
        cmd += ["--max-rate", str(max_rate)]
    if batch is not None:
        cmd += ["--batch", str(batch)]
    with log.open("wb") as out:
        return subprocess.Popen(cmd, cwd=BENCH, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--database-url",
        default=DEFAULT_URL,
        help=f"PostgreSQL; its job tables are emptied (default {DEFAULT_URL})",
    )
    parser.add_argument("--n", type=int, help="old finished jobs to prune (default 1,000,000)")
    parser.add_argument("--jobs", type=int, help="jobs due per window (default 2,000)")
    parser.add_argument("--span", type=float, help="seconds per window (default 20)")
    parser.add_argument(
        "--max-rate", type=int,
        help="delayjobs_prune's --max-rate, jobs/s (0: unpaced; default: the command's)",
    )  # fmt: skip
    parser.add_argument(
        "--batch", type=int, help="delayjobs_prune's --batch (default: the command's)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=1, help="the worker's --concurrency (default 1)"
    )
    parser.add_argument(
        "--alternate", type=float, metavar="SECONDS",
        help="stop and continue the prune every SECONDS: an A/B comparison within run (b)",
    )  # fmt: skip
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 100,000 old jobs, 1,000 jobs over 10 s"
    )
    parser.add_argument(
        "--statement-log", type=Path, metavar="PATH",
        help="the server's log file, readable here: log every statement's duration "
        "(log_min_duration_statement = 0 on the database for the run) and report the "
        "worker's, with the prune busy and idle",
    )  # fmt: skip
    parser.add_argument(
        "--alone", action="store_true",
        help="only the prune, no worker: its speed and the command's own CPU time",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, help="also write the report here (JSON)")
    args = parser.parse_args()
    n = args.n or (100_000 if args.quick else 1_000_000)
    jobs = args.jobs or (1000 if args.quick else 2000)
    span = args.span or (10.0 if args.quick else 20.0)
    report: dict[str, Any] = {
        "load_start": load(),
        "n": n,
        "jobs_per_window": jobs,
        "span_s": span,
        "max_rate": args.max_rate,
        "batch": args.batch,
        "concurrency": args.concurrency,
        "alternate_s": args.alternate,
        "started": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
    }
    workdir = Path(tempfile.mkdtemp(prefix="bench-prune-"))
    server = EmbeddedRedis(workdir / "redis")
    logging_on = False  # the server's statement log (--statement-log)
    try:
        os.environ.update({
            "BENCH_REDIS_URL": server.start(),
            "BENCH_DATABASE_URL": args.database_url,
            "PYTHONPATH": os.pathsep.join([str(BENCH), str(ROOT)]),
        })  # fmt: skip
        import redis
        from compare import create_database
        from peers.delayjobs_peer import Adapter
        from workloads import Run

        create_database(args.database_url)  # a fresh machine has none yet
        adapter = Adapter()  # django.setup(), migrate
        from django.db import connection

        if connection.vendor != "postgresql":
            raise SystemExit("this benchmark is for PostgreSQL: give --database-url")
        client = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
        client.flushdb()
        report["versions"] = adapter.versions() | {
            "python": platform.python_version(),
            "postgresql": adapter.settings["audit rows"],
            "redis-server": client.info("server")["redis_version"],
        }
        print(f"fixtures: {n:,} finished jobs and their events ...", flush=True)
        report["fixtures"] = fixtures(n)
        print(json.dumps(report["fixtures"]), flush=True)
        connection.close()
        env = os.environ.copy()
        if args.alone:
            report["prune"] = prune_alone(env, workdir / "prune.log", args.max_rate, args.batch)
            print(json.dumps(report["prune"]))
            if args.out:
                args.out.write_text(json.dumps(report, indent=2))
            return
        bench = Bench(adapter, client, jobs, span)
        harness = Run(adapter, client, workdir)
        waits = Waits(args.database_url)
        waits.start()
        steal = Steal()
        if args.statement_log:
            log_offset = args.statement_log.stat().st_size
            log_statements(connection, True)
            logging_on = True
        with harness.worker("prune", adapter.worker_cmd(args.concurrency)):
            # (a) no pruning: one window
            report["load_a_start"] = load()
            _, items = bench.schedule_window(bench.lead())
            bench.wait(items)
            done = bench.results()
            late_a = [(done[i][1] - due) * 1000 for i, due in items if i in done]
            report["a_waits"] = waits.take()
            report["a_steal_pct"] = steal.take()
            report["a"] = summary(late_a) | {"missing": len(items) - len(late_a)}
            print("(a) no pruning:", json.dumps(report["a"]), flush=True)
            # (b) windows while the prune runs
            report["load_b_start"] = load()
            waits.take()
            t0, items = bench.schedule_window(bench.lead())
            all_items = list(items)
            time.sleep(max(0.0, t0 - 1.0 - time.time()))
            prune_log = workdir / "prune.log"
            wal_start = waits.wal()
            prune_start = time.time()
            cpu_start = children_cpu()
            prune = run_prune(env, prune_log, args.max_rate, args.batch)
            alternate = Alternate(prune, args.alternate) if args.alternate else None
            if alternate:
                alternate.start()
            prune_end: float | None = None
            while True:
                bench.wait(items)
                if prune_end is None and prune.poll() is not None:
                    prune_end = time.time()  # to within a window's wait; refined below
                if prune_end is not None:
                    break
                print(f"prune still running after window {bench.windows}: another",
                      flush=True)  # fmt: skip
                _, items = bench.schedule_window(bench.lead())
                all_items += items
            prune.wait()
            prune_cpu = children_cpu() - cpu_start  # the worker is not waited for yet
            prune_end = prune_end_time(prune_log, prune_start, prune_end)
            wal_end = waits.wal()
            report["b_waits"] = waits.take()
            report["b_steal_pct"] = steal.take()
            # (c) no pruning again, after it: the machine's noise between (a) and (b)
            _, items = bench.schedule_window(bench.lead())
            bench.wait(items)
            done = bench.results()
            late_c = [(done[i][1] - due) * 1000 for i, due in items if i in done]
            report["c"] = summary(late_c) | {"missing": len(items) - len(late_c)}
            report["c_waits"] = waits.take()
            report["c_steal_pct"] = steal.take()
            waits.stopping.set()
            report["load_end"] = load()
        done = bench.results()
        during = [(done[i][1] - due) * 1000 for i, due in all_items
                  if i in done and prune_start <= due <= prune_end]  # fmt: skip
        after = [(done[i][1] - due) * 1000 for i, due in all_items
                 if i in done and due > prune_end]  # fmt: skip
        tail = prune_log.read_text(errors="replace")
        found = SUMMARY.search(tail)
        if prune.returncode != 0 or not found:
            raise SystemExit(f"the prune failed (exit {prune.returncode}): {tail[-800:]}")
        wall = prune_end - prune_start
        report["prune"] = {
            "jobs": int(found[1]), "events": int(found[2]), "batches": int(found[3]),
            "wall_s": round(wall, 1), "command_cpu_s": round(prune_cpu, 2),
            "jobs_per_s": round(int(found[1]) / wall), "events_per_s": round(int(found[2]) / wall),
            "windows": len(all_items) // jobs,
            "finished_before_last_window_ended": prune_end < all_items[-1][1],
            "wal_mb_server_wide": round((wal_end[0] - wal_start[0]) / 2**20),
            "checkpoints": wal_end[1] - wal_start[1],
        }  # fmt: skip
        report["b_windows"] = [
            summary([(done[i][1] - due) * 1000 for i, due in all_items[k:k + jobs] if i in done])
            | {"first_due_after_prune_start_s": round(all_items[k][1] - prune_start, 1)}
            for k in range(0, len(all_items), jobs)
        ]  # fmt: skip
        report["b"] = summary(during) | {
            "missing": sum(1 for i, _ in all_items if i not in done),
            "jobs_due_after_prune": len(after),
        }  # fmt: skip
        if alternate:
            alternate.join(5)
            on: list[float] = []
            off: list[float] = []
            for i, due in all_items:
                state = alternate.running_at(due) if i in done else None
                if state is not None and prune_start <= due <= prune_end:
                    (on if state else off).append((done[i][1] - due) * 1000)
            report["b_running"], report["b_stopped"] = summary(on), summary(off)
            if on and off:
                report["p99_ratio_alternate"] = round(pct(on, 99) / pct(off, 99), 2)
        if report["a"].get("p99_ms") and report["b"].get("p99_ms"):
            report["p99_ratio"] = round(report["b"]["p99_ms"] / report["a"]["p99_ms"], 2)
        if report["c"].get("p99_ms") and report["b"].get("p99_ms"):
            report["p99_ratio_c"] = round(report["b"]["p99_ms"] / report["c"]["p99_ms"], 2)
        if args.statement_log:
            log_statements(connection, False)
            logging_on = False
            where = {"path": str(args.statement_log), "offset": log_offset,
                     "prune_start": prune_start, "prune_end": prune_end}  # fmt: skip
            report["statement_log"] = where
            report["statements"] = pglog.statements(
                args.statement_log, log_offset, prune_start, prune_end
            )
        report["notes"] = bench.notes
        print_report(report)
        if args.out:
            args.out.write_text(json.dumps(report, indent=2))
    finally:
        if logging_on:  # a run that stopped early: left on, it logs every statement
            from django.db import DatabaseError

            try:
                log_statements(connection, False)
            except DatabaseError as exc:
                name = connection.settings_dict["NAME"]
                print(f"could not turn the statement log off ({exc}); run: ALTER DATABASE"
                      f" {name} RESET log_min_duration_statement", file=sys.stderr)  # fmt: skip
        server.close()


def children_cpu() -> float:
    """CPU seconds of the child processes waited for so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def prune_alone(env: dict[str, str], log: Path, max_rate: int | None,
                batch: int | None) -> dict[str, Any]:  # fmt: skip
    """The prune with no worker running: its wall time and the command's CPU time."""
    cpu, start = children_cpu(), time.perf_counter()
    process = run_prune(env, log, max_rate, batch)
    process.wait()
    wall, cpu = time.perf_counter() - start, children_cpu() - cpu
    found = SUMMARY.search(log.read_text())
    if process.returncode != 0 or not found:
        raise SystemExit(f"the prune failed (exit {process.returncode})")
    return {"jobs": int(found[1]), "events": int(found[2]), "batches": int(found[3]),
            "wall_s": round(wall, 1), "jobs_per_s": round(int(found[1]) / wall),
            "command_cpu_s": round(cpu, 2)}  # fmt: skip


def log_statements(connection: Any, on: bool) -> None:
    """Have the server log every statement of every new session of this database, or no
    longer (the worker, started afterwards, opens its connections then)."""
    name = connection.ops.quote_name(connection.settings_dict["NAME"])
    with connection.cursor() as cursor:
        if on:
            cursor.execute(f"ALTER DATABASE {name} SET log_min_duration_statement = 0")
        else:
            cursor.execute(f"ALTER DATABASE {name} RESET log_min_duration_statement")
    connection.close()


def prune_end_time(log: Path, start: float, fallback: float) -> float:
    """The log's mtime: the command's last line is written as it exits."""
    try:
        return max(start, log.stat().st_mtime)
    except OSError:
        return fallback


def print_report(r: dict[str, Any]) -> None:
    p = r["prune"]
    print()
    paced = {None: "the command's default pace", 0: "unpaced"}.get(
        r["max_rate"], f"--max-rate {r['max_rate']}"
    )
    if r.get("batch") is not None:
        paced += f", --batch {r['batch']}"
    if r.get("concurrency", 1) != 1:
        paced += f"; worker --concurrency {r['concurrency']}"
    print(f"prune ({paced}): {p['jobs']:,} jobs and {p['events']:,} events in "
          f"{p['batches']} batches, "
          f"{p['wall_s']:.1f} s: {p['jobs_per_s']:,} jobs/s, {p['events_per_s']:,} events/s, "
          f"the command's CPU {p['command_cpu_s']:.1f} s "
          f"({p['windows']} window(s) of {r['jobs_per_window']:,} jobs over "
          f"{r['span_s']:g} s while it ran)")  # fmt: skip
    print()
    print("| run | jobs | lateness p50 | p90 | p99 | max | early | missing |")
    print("|---|---|---|---|---|---|---|---|")
    rows = (("a", "(a) no pruning, before"), ("b", "(b) due while the prune ran"),
            ("c", "(c) no pruning, after"))  # fmt: skip
    for key, label in rows:
        s = r[key]
        if not s["jobs"]:
            print(f"| {label} | 0 | | | | | | {s['missing']} |")
            continue
        print(f"| {label} | {s['jobs']:,} | {s['p50_ms']:.1f} ms | {s['p90_ms']:.1f} ms | "
              f"{s['p99_ms']:.1f} ms | {s['max_ms']:.1f} ms | {s['early']} | "
              f"{s['missing']} |")  # fmt: skip
    if r.get("alternate_s"):
        for key, label in (("b_running", "(b) due while the prune ran"),
                           ("b_stopped", "(b) due while it was stopped")):  # fmt: skip
            s = r[key]
            if s["jobs"]:
                print(f"| {label}, every {r['alternate_s']:g} s | {s['jobs']:,} | "
                      f"{s['p50_ms']:.1f} ms | {s['p90_ms']:.1f} ms | {s['p99_ms']:.1f} ms | "
                      f"{s['max_ms']:.1f} ms | {s['early']} | |")  # fmt: skip
    print()
    if "p99_ratio_alternate" in r:
        verdict = "met" if r["p99_ratio_alternate"] <= TARGET_RATIO else "missed"
        print(f"p99 running / stopped = {r['p99_ratio_alternate']:.2f}: target <= "
              f"{TARGET_RATIO} {verdict}")  # fmt: skip
    if "p99_ratio" in r:
        verdict = "met" if r["p99_ratio"] <= TARGET_RATIO else "missed"
        print(f"p99 (b) / (a) = {r['p99_ratio']:.2f}: target <= {TARGET_RATIO} {verdict}")
    if "p99_ratio_c" in r:
        print(f"p99 (b) / (c) = {r['p99_ratio_c']:.2f}")
    print(f"WAL written meanwhile (whole server): {p['wal_mb_server_wide']:,} MB, "
          f"{p['checkpoints']} checkpoint(s)")  # fmt: skip
    for key in ("a_waits", "b_waits", "c_waits"):
        print(f"pg_stat_activity, {key[0]}:", json.dumps(r[key]))
    if "statements" in r:
        print()
        print("| worker statement (server-side ms) | phase | n | p50 | p99 | max |")
        print("|---|---|--:|--:|--:|--:|")
        for what, phases in r["statements"].items():
            for phase, s in phases.items():
                print(f"| {what} | {phase} | {s['n']:,} | {s['p50_ms']:.2f} | "
                      f"{s['p99_ms']:.2f} | {s['max_ms']:.2f} |")  # fmt: skip
        print()
    for k, w in enumerate(r["b_windows"], 1):
        print(f"(b) window {k}:", json.dumps(w))
    print("CPU steal (% of CPU time):", {k[0]: r[k] for k in ("a_steal_pct", "b_steal_pct",
                                                              "c_steal_pct")})  # fmt: skip
    print(f"load average (1, 5, 15 min): start {r['load_start']}, end {r['load_end']}")
    print("versions:", ", ".join(f"{k} {v}" for k, v in r["versions"].items()))
    for note in r["notes"]:
        print("note:", note)


if __name__ == "__main__":
    main()
