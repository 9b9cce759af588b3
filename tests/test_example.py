"""The example shop end to end, as real processes: ``manage.py demo`` and ``manage.py race``.

Each test runs a command of ``example_project/`` in a child process with that project's
settings, on a database of its own (a temporary SQLite file, or a fresh PostgreSQL
database when ``DATABASE_URL`` is a PostgreSQL URL) and this test run's Redis when
``REDIS_URL`` is set (otherwise the command starts its own private redis-server, as it does
for a newcomer).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.helpers import ROOT

MANAGE = ROOT / "example_project" / "manage.py"
POSTGRES_SCHEMES = ("postgres", "postgresql", "pgsql")

pytestmark = pytest.mark.slow


def postgres_url() -> str | None:
    url = os.environ.get("DATABASE_URL", "")
    return url if urlsplit(url).scheme in POSTGRES_SCHEMES else None


@contextlib.contextmanager
def fresh_postgres(url: str) -> Iterator[str]:
    """Create an empty database next to ``url``'s, yield its URL, drop it afterwards."""
    import dj_database_url
    import psycopg

    db = dj_database_url.parse(url)
    name = f"delayjobs_shop_{uuid.uuid4().hex[:10]}"
    params = {
        "host": db["HOST"] or None,
        "port": db["PORT"] or None,
        "user": db["USER"] or None,
        "password": db["PASSWORD"] or None,
    }
    with psycopg.connect(dbname="postgres", autocommit=True, **params) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlsplit(url)._replace(path=f"/{name}").geturl()
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True, **params) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def shop_env(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """Environment for an example-project child process: its own database, our Redis."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL", "SHOP_SQLITE_PATH", "DJANGO_SETTINGS_MODULE")
    }
    env["PYTHONUNBUFFERED"] = "1"
    if os.environ.get("REDIS_URL"):
        request.getfixturevalue("redis_client")  # flushes that database first
        env["REDIS_URL"] = os.environ["REDIS_URL"]
    url = postgres_url()
    if url is None:
        env["SHOP_SQLITE_PATH"] = str(tmp_path / "shop.sqlite3")
        yield env
        return
    with fresh_postgres(url) as fresh:
        yield {**env, "DATABASE_URL": fresh}


def manage(
    env: dict[str, str], *args: str, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(MANAGE), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def number(pattern: str, text: str) -> tuple[int, ...]:
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in the report:\n{text}"
    return tuple(int(g) for g in match.groups())


def test_demo_end_to_end(shop_env: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    run = manage(shop_env, "demo", "--orders", "10", "--deadline", "2", "--worker-log", str(log))
    out = run.stdout
    detail = f"exit {run.returncode}\n{out}\n{run.stderr}"
    assert run.returncode == 0, detail

    # 10 orders: 5 paid before their deadline, 1 exactly at it, 4 never.
    assert number(r"unpaid orders cancelled:\s+(\d+)/(\d+)", out) == (4, 4), detail
    assert number(r"paid orders wrongly cancelled:\s+(\d+)/(\d+)", out) == (0, 5), detail
    assert number(r"cancelled by the payment: (\d+)/(\d+)", out) == (5, 5), detail
    racing, payment_won, cancel_won = number(
        r"paid exactly at the deadline:\s+(\d+)\s+payment won \(paid, job cancelled\): (\d+)"
        r"\s+cancel won \(cancelled, payment refused\): (\d+)",
        out,
    )
    assert racing == 1 and payment_won + cancel_won == 1, detail
    assert number(r"orders both paid and cancelled:\s+(\d+)", out) == (0,), detail
    sent, withdrawn, reminded, unpaid = number(
        r"payment reminders \(signed callbacks\): (\d+) sent and verified by the shop, "
        r"(\d+) cancelled by the payment; unpaid orders reminded: (\d+)/(\d+)",
        out,
    )
    assert (reminded, unpaid) == (4, 4) and sent + withdrawn == 10, detail
    assert number(r"a reminder with a forged signature:\s+answered (\d+)", out) == (401,)
    assert re.search(r"job started_at - run_at:\s+p50 [\d.]+ ms, p99 [\d.]+ ms, max [\d.]+ ms", out)
    assert number(r"worker exit code\(s\):\s+(\d+)", out) == (0,), detail
    assert "OK: every unpaid order was cancelled" in out, detail
    assert "FAILED" not in out
    assert "/admin/django_delayjobs/job/" in out and "createsuperuser" in out, detail
    # The progress display while waiting (one line a second when not on a terminal).
    assert re.search(r"orders:\s+\d+ pending\s+\d+ paid\s+\d+ cancelled", out), detail
    assert log.exists()


def test_demo_rejects_impossible_options(shop_env: dict[str, str]) -> None:
    run = manage(shop_env, "demo", "--orders", "10", "--at-deadline", "6")
    assert run.returncode == 1
    assert "--at-deadline must be between 0 and 5" in run.stderr


@pytest.mark.skipif(
    postgres_url() is None,
    reason="the payment/cancel race needs row locks: it runs on PostgreSQL "
    "(set DATABASE_URL=postgres://...; CI's PostgreSQL pass does)",
)
def test_race_paid_at_exactly_the_deadline_postgresql(
    shop_env: dict[str, str], tmp_path: Path
) -> None:
    """200 orders paid exactly at their deadline while two worker processes cancel them."""
    log = tmp_path / "workers.log"
    run = manage(shop_env, "race", "--orders", "200", "--workers", "2", "--worker-log", str(log))
    detail = f"exit {run.returncode}\n{run.stdout}\n{run.stderr}\n" + (
        log.read_text(errors="replace")[-3000:] if log.exists() else ""
    )
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    print(json.dumps(summary, indent=2))  # shown with -s or on failure

    assert summary["database"] == "postgresql"
    assert summary["workers"] == 2 and summary["worker_exit_codes"] == [0, 0], detail
    assert summary["finished"], detail
    # Every order ends paid with its job cancelled, or cancelled by its (succeeded) job.
    assert summary["outcomes"]["paid"] + summary["outcomes"]["cancelled"] == 200, detail
    assert summary["fault_count"] == 0 and summary["faults"] == [], detail
    assert summary["both_paid_and_cancelled"] == 0, detail
    # No deadlock (nor any other error but "refused") reached the payment path.
    assert summary["payment_errors"] == [], detail
    assert summary["deadlocks_in_worker_logs"] == 0, detail
    assert summary["ok"] and run.returncode == 0, detail
