"""HTTP callbacks: 1,000 due at the same moment, to a local server that answers in 50 ms.

    python bench/callbacks.py [--n 1000] [--concurrency 1 10 50] [--delay-ms 50]
                              [--lead 10] [--database-url URL] [--json out.json]

For each concurrency: a private ``redis-server``, the bench's Django settings
(``peers/dj_settings.py``: SQLite in WAL mode, or ``--database-url``), one
``run_delayworker --concurrency C`` process, and a threaded HTTP server on 127.0.0.1 in
this process that records when each request arrives and answers 200 after ``--delay-ms``.
N callbacks (``schedule_http``, signed) are scheduled in one transaction, all due at the
same moment ``--lead`` seconds ahead. Reported:

- drain: from the due time until the last job's outcome is committed (``finished_at``);
- lateness of the first request of each job (its arrival at the server minus the due
  time; retries are not counted): the earliest, p50, p99, max;
- every job's status (all must have succeeded, each with exactly one request).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(ROOT)]

from django_delayjobs.embedded import EmbeddedRedis  # noqa: E402

SECRET = "whsec_YmVuY2gtb25seS1zZWNyZXQtMzItYnl0ZXMtbG9uZyE="


class Receiver:
    """A threaded HTTP server: records (webhook-id, arrival time), answers after a delay."""

    def __init__(self, delay: float) -> None:
        self.arrivals: list[tuple[str, float]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                arrived = time.time()
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.lock:
                    receiver.arrivals.append((self.headers.get("webhook-id", ""), arrived))
                time.sleep(delay)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        ThreadingHTTPServer.request_queue_size = 1024
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def wait_for_worker(queue: str, worker: subprocess.Popen[bytes], timeout: float = 60) -> None:
    from django_delayjobs.connection import get_engine

    deadline = time.monotonic() + timeout
    while worker.pid not in {w.get("pid") for w in get_engine().workers(queue)}:
        if worker.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the worker did not start (exit code {worker.poll()})")
        time.sleep(0.05)


def one_round(n: int, concurrency: int, receiver: Receiver, env: dict[str, str],
              log: Path, lead: float) -> dict[str, Any]:  # fmt: skip
    import datetime

    from django.db import transaction
    from django.db.models import Count, Max

    from django_delayjobs import schedule_http
    from django_delayjobs.connection import get_engine
    from django_delayjobs.models import Job, JobEvent

    JobEvent.objects.all().delete()
    Job.objects.all().delete()
    get_engine().client.flushdb()
    receiver.arrivals.clear()
    cmd = [sys.executable, "-m", "django", "run_delayworker", "-v", "1",
           "--concurrency", str(concurrency)]  # fmt: skip
    with open(log, "ab") as out:
        worker = subprocess.Popen(cmd, cwd=BENCH, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_worker("default", worker)
        due = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=lead)
        url = f"http://127.0.0.1:{receiver.port}/hook"
        scheduling = time.monotonic()
        with transaction.atomic():
            for i in range(n):
                schedule_http(url, json={"n": i}, at=due)
        scheduling = time.monotonic() - scheduling
        if datetime.datetime.now(datetime.UTC) >= due:
            raise SystemExit("scheduling took longer than the lead time: raise --lead")
        deadline = time.monotonic() + 600
        while Job.objects.filter(status__in=["scheduled", "running", "retrying"]).exists():
            if time.monotonic() > deadline or worker.poll() is not None:
                raise SystemExit("the jobs did not finish (see the worker log)")
            time.sleep(0.1)
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(60)
    statuses = dict(Job.objects.values_list("status").annotate(c=Count("pk")))
    last = Job.objects.aggregate(last=Max("finished_at"))["last"]
    first_arrival: dict[str, float] = {}
    for job_id, arrived in receiver.arrivals:
        first_arrival.setdefault(job_id, arrived)
    late = [(at - due.timestamp()) * 1000 for at in first_arrival.values()]
    return {
        "concurrency": concurrency,
        "n": n,
        "statuses": statuses,
        "requests": len(receiver.arrivals),
        "jobs_reached": len(first_arrival),
        "scheduling_s": round(scheduling, 2),
        "drain_s": round((last - due).total_seconds(), 3),
        "first_request_ms": round(min(late), 1),
        "lateness_p50_ms": round(percentile(late, 50), 1),
        "lateness_p99_ms": round(percentile(late, 99), 1),
        "lateness_max_ms": round(max(late), 1),
        "worker_exit": code,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 10, 50])
    parser.add_argument("--delay-ms", type=float, default=50.0)
    parser.add_argument("--lead", type=float, default=10.0,
                        help="seconds from scheduling to the due time (default 10)")  # fmt: skip
    parser.add_argument("--database-url", help="PostgreSQL (or other) instead of SQLite")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-callbacks-"))
    redis_server = EmbeddedRedis(workdir / "redis")
    receiver = Receiver(args.delay_ms / 1000)
    try:
        http = {
            "HTTP_ALLOWED_HOSTS": [f"127.0.0.1:{receiver.port}"],
            "HTTP_ALLOW_PRIVATE_NETWORKS": True,  # the receiver is on this machine
            "HTTP_SIGNING_SECRETS": [SECRET],
        }
        os.environ.update({
            "BENCH_REDIS_URL": redis_server.start(),
            "BENCH_SQLITE_PATH": str(workdir / "callbacks.sqlite3"),
            "BENCH_DELAYJOBS": json.dumps(http),
            "DJANGO_SETTINGS_MODULE": "peers.dj_settings",
        })  # fmt: skip
        if args.database_url:
            os.environ["BENCH_DATABASE_URL"] = args.database_url
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH), str(ROOT)])}
        import django
        from django.core.management import call_command
        from django.db import connection

        django.setup()
        call_command("migrate", verbosity=0)
        print(f"{args.n} callbacks due at once; receiver answers after {args.delay_ms:g} ms; "
              f"database {connection.vendor}; worker log {workdir / 'worker.log'}")  # fmt: skip
        results = []
        for concurrency in args.concurrency:
            result = one_round(args.n, concurrency, receiver, env, workdir / "worker.log",
                               args.lead)  # fmt: skip
            results.append(result)
            print(json.dumps(result))
        print()
        print("| --concurrency | drain | first request | lateness p50 | p99 | max | jobs |")
        print("|---|---|---|---|---|---|---|")
        for r in results:
            ok = r["statuses"].get("succeeded", 0)
            print(f"| {r['concurrency']} | {r['drain_s']:.2f} s | {r['first_request_ms']:.0f} ms | "
                  f"{r['lateness_p50_ms']:.0f} ms | {r['lateness_p99_ms']:.0f} ms | "
                  f"{r['lateness_max_ms']:.0f} ms | {ok}/{r['n']} succeeded, "
                  f"{r['requests']} requests |")  # fmt: skip
        if args.json:
            args.json.write_text(json.dumps({"database": connection.vendor, "results": results},
                                            indent=2))  # fmt: skip
    finally:
        receiver.close()
        redis_server.close()


if __name__ == "__main__":
    main()
