"""Time the admin's job list, job detail and queue page with 1,000,000 jobs on PostgreSQL.

    python bench/admin_page.py --database-url postgres://postgres@127.0.0.1:5432/bench
        [--rows 1000000] [--redis-url URL] [--runs 5] [--keep] [--json PATH]

It creates (and drops, unless ``--keep``) the database ``test_<name>`` the way the test
suite does, inserts the rows with one ``INSERT ... SELECT FROM generate_series`` (a mix
of statuses, queues, actions and targets, as a shop would have after months), ANALYZEs,
puts the scheduled and dead ids into Redis, then requests each page with Django's test
client as a superuser: one warm-up request, then ``--runs`` timed ones. It prints the
median and slowest time of each page, its number of SQL queries and its slowest query.

Without ``--redis-url`` a private ``redis-server`` is started and stopped. With one, only
keys under a prefix of its own are written, and deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

INSERT = """
INSERT INTO {job} (id, queue, action, target_type_id, target_id, args, kwargs, key, run_at,
                   expires_at, status, attempts, max_attempts, worker, created_at, started_at,
                   finished_at, last_error, result)
SELECT gen_random_uuid(), s.queue, s.action,
       CASE WHEN mod(g, 2) = 0 THEN %(thing_type)s END,
       CASE WHEN mod(g, 2) = 0 THEN (g / 2)::text END,
       '[]'::jsonb, '{{}}'::jsonb,
       CASE WHEN mod(g, 5) = 0 THEN 'order-' || g || '-autocancel' END,
       s.run_at, NULL, s.status,
       CASE WHEN s.status IN ('scheduled') THEN 0 WHEN s.status = 'dead' THEN 5 ELSE 1 END,
       5, CASE WHEN s.started THEN 'bench-worker' ELSE '' END,
       s.run_at - interval '30 minutes',
       CASE WHEN s.started THEN s.run_at + (mod(g, 900)) * interval '1 millisecond' END,
       CASE WHEN s.status IN ('succeeded', 'dead', 'skipped', 'cancelled')
            THEN s.run_at + interval '1 second' END,
       CASE WHEN s.status = 'dead' THEN
            E'Traceback (most recent call last):\\n  File "shop/orders.py", line 42, in cancel\\n'
            || E'RuntimeError: payment provider timed out (job ' || g || ')' ELSE '' END,
       CASE WHEN s.status = 'succeeded' THEN '"ok"'::jsonb END
FROM generate_series(1, %(rows)s) AS g
CROSS JOIN LATERAL (
  SELECT
    CASE WHEN mod(g, 10) < 7 THEN 'default' WHEN mod(g, 10) < 9 THEN 'orders' ELSE 'mail' END
      AS queue,
    (ARRAY['shop.Order.cancel', 'shop.Order.remind', 'shop.tasks.send_receipt',
           'shop.tasks.sync_stock', 'shop.Cart.expire', 'shop.tasks.report'])[1 + mod(g, 6)]
      AS action,
    st.status,
    st.status NOT IN ('scheduled', 'cancelled') AS started,
    CASE WHEN st.status IN ('scheduled', 'retrying')
         THEN now() + (mod(g, 86400)) * interval '1 second'
         ELSE now() - interval '120 days' + (g::float / %(rows)s) * interval '120 days' END
      AS run_at
  FROM (SELECT CASE WHEN mod(g, 1000) < 900 THEN 'succeeded'
                    WHEN mod(g, 1000) < 940 THEN 'cancelled'
                    WHEN mod(g, 1000) < 970 THEN 'scheduled' WHEN mod(g, 1000) < 980 THEN 'dead'
                    WHEN mod(g, 1000) < 990 THEN 'skipped' WHEN mod(g, 1000) < 995 THEN 'retrying'
                    ELSE 'running' END AS status) AS st
) AS s
"""


@contextmanager
def redis_server(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    from django_delayjobs.embedded import EmbeddedRedis

    server = EmbeddedRedis()
    try:
        yield server.start()
    finally:
        server.close()


def setup_django(database_url: str, redis_url: str, prefix: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ["REDIS_URL"] = redis_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django
    from django.conf import settings

    django.setup()
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": redis_url, "PREFIX": prefix}
    settings.ALLOWED_HOSTS = ["testserver"]


def insert_jobs(rows: int) -> float:
    from django.contrib.contenttypes.models import ContentType
    from django.db import connection

    from django_delayjobs.models import Job
    from tests.testapp.models import Thing

    thing_type = ContentType.objects.get_for_model(Thing).pk
    sql = INSERT.format(job=connection.ops.quote_name(Job._meta.db_table))
    t0 = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(sql, {"rows": rows, "thing_type": thing_type})
        cursor.execute(f"ANALYZE {connection.ops.quote_name(Job._meta.db_table)}")
    return time.perf_counter() - t0


def fill_redis() -> dict[str, int]:
    """Scheduled ids into pending, dead ones through ready and unack into garbage."""
    from django_delayjobs import services
    from django_delayjobs.connection import get_engine
    from django_delayjobs.models import Job, Status

    engine = get_engine()
    services.push(Job.objects.filter(status__in=[Status.SCHEDULED, Status.RETRYING]).iterator())
    dead = 0
    for queue in ("default", "orders", "mail"):
        dead_rows = Job.objects.filter(queue=queue, status=Status.DEAD)
        ids = [str(pk) for pk in dead_rows.values_list("pk", flat=True)]
        for start in range(0, len(ids), 5000):
            chunk = ids[start : start + 5000]
            engine.add(queue, dict.fromkeys(chunk, 0))
            engine.promote(queue, batch=5000)
            claimed = engine.claim(queue, count=len(chunk), lease_ms=60_000)
            if claimed:
                dead += engine.bury(queue, claimed)
    return {"dead_buried": dead}


def pages() -> list[tuple[str, str, dict[str, str]]]:
    from django.urls import reverse

    from django_delayjobs.models import Job, Status

    changelist = reverse("admin:django_delayjobs_job_changelist")
    dead = Job.objects.filter(status=Status.DEAD).order_by("-run_at").first()
    keyed = Job.objects.filter(key__isnull=False).order_by("run_at").first()
    targeted = Job.objects.filter(target_id__isnull=False).order_by("run_at").first()
    assert dead and keyed and targeted
    last = Job.objects.order_by("-run_at").first()
    assert last is not None
    return [
        ("job list", changelist, {}),
        ("job list, page 2", changelist, {"p": "2"}),
        ("job list, page 1000", changelist, {"p": "1000"}),
        ("job list, status = dead", changelist, {"status__exact": "dead"}),
        ("job list, queue = orders", changelist, {"queue": "orders"}),
        ("job list, action = shop.Cart.expire", changelist, {"action": "shop.Cart.expire"}),
        ("job list, status = retrying, queue = mail", changelist,
         {"status__exact": "retrying", "queue": "mail"}),
        ("job list, one month", changelist,
         {"run_at__year": str(last.run_at.year), "run_at__month": str(last.run_at.month)}),
        ("job list, search by id", changelist, {"q": str(dead.pk)}),
        ("job list, search by key", changelist, {"q": str(keyed.key)}),
        ("job list, search by target id", changelist, {"q": str(targeted.target_id)}),
        ("job detail (dead job)", reverse("admin:django_delayjobs_job_change", args=[dead.pk]), {}),
        ("queue page", reverse("admin:django_delayjobs_queues"), {}),
    ]  # fmt: skip


def measure(runs: int) -> list[dict[str, Any]]:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    user = get_user_model().objects.create_superuser("bench", "bench@example.com", "bench")
    client = Client()
    client.force_login(user)
    results = []
    for label, url, params in pages():
        response = client.get(url, params)  # warm-up: caches, plans, connections
        if response.status_code != 200:
            raise SystemExit(f"{label}: HTTP {response.status_code} for {url} {params}")
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            client.get(url, params)
            times.append(time.perf_counter() - t0)
        with CaptureQueriesContext(connection) as captured:
            client.get(url, params)
        slowest = max(captured.captured_queries, key=lambda q: float(q["time"]))
        results.append({
            "page": label,
            "median_ms": round(statistics.median(times) * 1000, 1),
            "max_ms": round(max(times) * 1000, 1),
            "queries": len(captured),
            "slowest_query_ms": round(float(slowest["time"]) * 1000, 1),
            "slowest_query": slowest["sql"][:300],
        })  # fmt: skip
        print(f"  {label:45} {results[-1]['median_ms']:8.1f} ms", flush=True)
    return results


def server_versions() -> dict[str, str]:
    import django
    from django.db import connection

    from django_delayjobs.connection import get_engine

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        postgres = cursor.fetchone()[0]
    return {
        "python": platform.python_version(),
        "django": django.get_version(),
        "postgresql": postgres,
        "redis": str(get_engine().info().get("redis_version")),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if not args.database_url or not args.database_url.startswith("postgres"):
        raise SystemExit("give --database-url postgres://... (or DATABASE_URL): PostgreSQL only")

    prefix = f"bench{os.getpid()}"
    with redis_server(args.redis_url) as redis_url:
        setup_django(args.database_url, redis_url, prefix)
        from django.db import connection

        name = connection.creation.create_test_db(verbosity=0, autoclobber=True,
                                                  keepdb=args.keep)  # fmt: skip
        try:
            print(f"admin bench: {args.rows:,} jobs into {name}", flush=True)
            seconds = insert_jobs(args.rows)
            print(f"  inserted and analysed in {seconds:.1f} s", flush=True)
            filled = fill_redis()
            print(f"  Redis: {filled}", flush=True)
            results = measure(args.runs)
            versions = server_versions()
        finally:
            from django_delayjobs.connection import get_engine

            engine = get_engine()
            keys = list(engine.client.scan_iter(match=f"{{{prefix}*"))
            if keys:
                engine.client.delete(*keys)
            if not args.keep:
                connection.creation.destroy_test_db(name, verbosity=0)
    report = {"rows": args.rows, "runs": args.runs, **versions, "pages": results}
    print()
    print(f"| page ({args.rows:,} jobs) | median | slowest | queries | slowest query |")
    print("|---|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['page']} | {r['median_ms']:.0f} ms | {r['max_ms']:.0f} ms | {r['queries']} "
              f"| {r['slowest_query_ms']:.1f} ms |")  # fmt: skip
    print()
    print(", ".join(f"{k} {report[k]}" for k in ("python", "django", "postgresql", "redis",
                                                  "machine")))  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
