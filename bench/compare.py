"""Run the same delayed-job workloads on delayjobs, Celery, RQ, Huey and Dramatiq.

    python bench/compare.py [--quick] [--systems delayjobs,celery,rq,huey,dramatiq]
                            [--workloads W1,W2,W3,W4,W5] [--database-url URL]
                            [--also-postgres URL] [--out bench/results/] [--dump DIR]
    python bench/compare.py --render bench/results/latest.json

Run it with the interpreter of the venv that holds ``bench/requirements.txt`` (``python3
dev.py compare`` does). One system at a time, each on a fresh private ``redis-server``
(``EmbeddedRedis``, unix socket) that is flushed between workloads and stopped at the end,
with one worker process. Every job records its own start time in that Redis (see
``peers/common.py``). The workloads are in ``workloads.py``:

W1 schedule N jobs due in 1 h from this process (no worker running): jobs/s, and Redis
   ``used_memory`` delta / N.
W2 N jobs due uniformly over T s: lateness (start - due) p50/p90/p99/max, early, missing,
   duplicated runs.
W3 N jobs due at the same moment: jobs/s from the due time until the last one started.
W4 with M jobs already pending 1 day out (scheduled before the worker starts, with the
   system's fastest way: its batch API, else one at a time): Redis bytes per pending job,
   then the schedule rate and lateness of K near-term jobs. A size whose prefill would
   take over PREFILL_BUDGET at the rate the previous size's prefill ran, or that follows a
   failed size, is reported as not run.
W5 delayjobs only, with --database-url (so: in the --also-postgres pass): W3's drain with
   ``run_delayworker --concurrency`` 1, 2, 4 and with 2 processes.

``--also-postgres URL`` runs delayjobs again with its audit rows in that database (created
if missing, emptied before each workload), W1, W2, W3 and W5, in a process of its own.
The environment variable ``BENCH_DATABASE_OPTIONS`` (JSON) adds to that database's Django
``OPTIONS`` (for example server-side binding with prepared statements; the report records
them).

Writes ``compare-<stamp>.json`` and ``compare-<stamp>.md`` (and ``latest.*``) to --out,
with the targets of issue 18 computed from the same run (``targets.py``). ``--dump DIR``
also writes every workload's raw records there, one ``[job id, due, started]`` (Unix
seconds) per run of a job, as ``<system>-<workload>.json`` (the PostgreSQL pass's in
``DIR/postgresql/``).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

import redis  # noqa: E402
import targets  # noqa: E402
from peers import SYSTEMS  # noqa: E402
from tables import markdown  # noqa: E402
from workloads import Run, w1, w2, w3, w4, w5  # noqa: E402

from django_delayjobs.embedded import EmbeddedRedis  # noqa: E402

FULL = {
    "w1": 20_000,
    "w2": 3_000,
    "w2_span": 10.0,
    "w3": 20_000,
    "w4": [1_000, 100_000, 1_000_000],
    "w4_jobs": 2_000,
    "w5": 20_000,
}
QUICK = {
    "w1": 2_000,
    "w2": 500,
    "w2_span": 5.0,
    "w3": 2_000,
    "w4": [1_000, 10_000],
    "w4_jobs": 500,
    "w5": 2_000,
}
WORKLOADS = ("W1", "W2", "W3", "W4", "W5")
POSTGRES_WORKLOADS = ("W1", "W2", "W3", "W5")


def plan(run: Run, sizes: dict[str, Any]) -> dict[str, Callable[[], dict[str, Any]]]:
    return {
        "W1": lambda: w1(run, sizes["w1"]),
        "W2": lambda: w2(run, sizes["w2"], sizes["w2_span"]),
        "W3": lambda: w3(run, sizes["w3"]),
        "W4": lambda: w4(run, sizes["w4"], sizes["w4_jobs"]),
        "W5": lambda: w5(run, sizes["w5"]),
    }


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
        steps = plan(run, sizes)
        for workload in args.workloads:
            if workload == "W5" and not (adapter.scales and args.database_url):
                continue  # delayjobs only, on the --database-url (--also-postgres) pass
            print(f"  {name} {workload} ...", flush=True)
            started = time.time()
            try:
                result[workload] = steps[workload]()
            except Exception as exc:  # report, don't crash the harness
                result[workload] = {"failed": f"{type(exc).__name__}: {exc}"[:800]}
            result[workload]["seconds"] = round(time.time() - started, 1)
            if args.dump:  # the records stay in Redis until the next workload's clean()
                dump = Path(args.dump) / f"{name}-{workload}.json"
                dump.write_text(json.dumps(run.results()))
            print(f"  {name} {workload}: {json.dumps(result[workload])[:300]}", flush=True)
    except Exception as exc:
        result["failed"] = f"{type(exc).__name__}: {exc}"[:800]
    finally:
        server.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def create_database(url: str) -> None:
    """Create the --also-postgres database if it does not exist yet."""
    import dj_database_url
    import psycopg
    from psycopg import sql

    db = dj_database_url.parse(url)
    params = {"host": db.get("HOST"), "port": db.get("PORT"), "user": db.get("USER"),
              "password": db.get("PASSWORD")}  # fmt: skip
    params = {k: v for k, v in params.items() if v}
    with psycopg.connect(dbname="postgres", autocommit=True, **params) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]])
        if found.fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db["NAME"])))


def postgres_pass(args: argparse.Namespace) -> dict[str, Any]:
    """delayjobs with the audit rows on PostgreSQL, in a process of its own (Django's
    settings are fixed once set up)."""
    print(f"{targets.POSTGRES}:", flush=True)
    workloads = [w for w in args.workloads if w in POSTGRES_WORKLOADS]
    try:
        create_database(args.also_postgres)
        with tempfile.TemporaryDirectory() as out:
            command = [
                sys.executable, __file__, "--systems", "delayjobs", "--workloads",
                ",".join(workloads), "--database-url", args.also_postgres, "--out", out,
            ]  # fmt: skip
            if args.dump:
                command += ["--dump", str(Path(args.dump) / "postgresql")]
            subprocess.run(command + (["--quick"] if args.quick else []), check=True)
            (result,) = json.loads((Path(out) / "latest.json").read_text())["systems"]
    except Exception as exc:  # keep the other systems' figures
        result = {"failed": f"{type(exc).__name__}: {exc}"[:800]}
    return result | {"system": targets.POSTGRES}


def machine() -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg()[0],
    }


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, a few minutes")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--database-url", help="delayjobs audit rows there instead of SQLite")
    parser.add_argument(
        "--also-postgres",
        metavar="URL",
        help="add 'delayjobs (PostgreSQL)' rows (W1, W2, W3, W5): audit rows in this database "
        "(created if missing, emptied)",
    )
    parser.add_argument("--out", default=str(BENCH / "results"))
    parser.add_argument("--render", metavar="JSON", help="only re-render a report as Markdown")
    parser.add_argument("--dump", metavar="DIR", help="also write each workload's raw records")
    args = parser.parse_args()
    args.systems = [s.strip() for s in args.systems.split(",")]
    args.workloads = [w.strip().upper() for w in args.workloads.split(",")]
    for what, given, known in (("system", args.systems, SYSTEMS),
                               ("workload", args.workloads, WORKLOADS)):  # fmt: skip
        if unknown := [x for x in given if x not in known]:
            parser.error(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(known)})")
    return args


def main() -> None:
    args = arguments()
    if args.render:
        report = json.loads(Path(args.render).read_text())
        print(markdown(report | {"targets": targets.evaluate(report)}))
        return
    sizes = QUICK if args.quick else FULL
    report: dict[str, Any] = {
        "quick": args.quick,
        "sizes": sizes,
        "command": " ".join(sys.argv),
        "machine": machine(),
        "systems": [],
    }
    if args.dump:
        Path(args.dump).mkdir(parents=True, exist_ok=True)
    started = time.time()
    for name in args.systems:
        print(f"{name}:", flush=True)
        report["systems"].append(run_system(name, args, sizes))
        if name == "delayjobs" and args.also_postgres:
            report["systems"].append(postgres_pass(args))
    report["seconds"] = round(time.time() - started)
    report["machine"]["load_average_at_end"] = os.getloadavg()[0]
    report["targets"] = targets.evaluate(report)
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
