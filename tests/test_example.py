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
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.helpers import ROOT

MANAGE = ROOT / "example_project" / "manage.py"
POSTGRES_SCHEMES = ("postgres", "postgresql", "pgsql")
LINUX = sys.platform.startswith("linux")

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
    # Each reminder is due halfway to its deadline and expires at it: under a second the
    # worker's ordinary lateness made them expire, and the demo then failed its own check.
    run = manage(shop_env, "demo", "--orders", "10", "--deadline", "0.9")
    assert run.returncode == 2
    assert "--deadline" in run.stderr and "at least 1" in run.stderr


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


# -- processes ---------------------------------------------------------------------------


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not reaped, does not count)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait until none of ``pids`` runs; return those still running after ``timeout``."""
    deadline = time.monotonic() + timeout
    while (left := [pid for pid in pids if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


class Output:
    """Collects a child's stdout lines in a thread; ``wait_for`` a line matching a regex."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert process.stdout is not None
        self.thread = threading.Thread(target=self._read, args=(process.stdout,), daemon=True)
        self.thread.start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines.append(line)

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if match := re.search(pattern, line):
                    return match
            time.sleep(0.05)
        raise AssertionError(f"{pattern!r} not printed within {timeout} s:\n{self.text}")

    def close(self, process: subprocess.Popen[str]) -> None:
        """Kill ``process`` if it still runs, and close its output (read to the end)."""
        process.kill()
        process.wait()
        self.thread.join(10)
        assert process.stdout is not None
        process.stdout.close()

    @property
    def text(self) -> str:
        return "".join(self.lines)


def redis_dir(pid: int) -> Path:
    return Path(os.readlink(f"/proc/{pid}/cwd"))  # redis-server works in its --dir


def start_demo(
    env: dict[str, str], tmp_path: Path, *extra: str
) -> tuple[subprocess.Popen[str], Output]:
    """``manage.py demo`` with deadlines far enough away that it is still running.

    Its SIGINT is set back to the default: a shell without job control (``cmd &`` in a
    script, CI) starts a process with SIGINT ignored, and Python then never turns a
    SIGINT into KeyboardInterrupt, so the Ctrl-C these tests send would do nothing."""
    process = subprocess.Popen(
        [sys.executable, str(MANAGE), "demo", "--orders", "4", "--deadline", "60",
         "--arrivals", "0.2", *extra, "--worker-log", str(tmp_path / "worker.log")],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    return process, Output(process)


def demo_processes(out: Output, pids: list[int]) -> Path:
    """Add the pids of the demo's redis-server and workers to ``pids`` as it prints them
    (the caller kills what is listed if the test fails); return the server's directory."""
    server = int(out.wait_for(r"redis-server \(pid (\d+)", 120)[1])
    pids.append(server)
    directory = redis_dir(server)
    workers = out.wait_for(r"run_delayworker process\(es\) \(pid ([\d, ]+)\)", 120)[1]
    pids += [int(pid) for pid in workers.split(", ")]
    return directory


@pytest.fixture
def newcomer_env(tmp_path: Path) -> dict[str, str]:
    """A newcomer's environment: no REDIS_URL (the demo starts its own private Redis,
    whose process these tests watch), a fresh SQLite file."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")
    }
    env["SHOP_SQLITE_PATH"] = str(tmp_path / "shop.sqlite3")
    env["PYTHONUNBUFFERED"] = "1"
    return env


# -- the demo and signals ----------------------------------------------------------------


@pytest.mark.skipif(not LINUX, reason="reads /proc")
@pytest.mark.timeout(180)
def test_demo_stops_its_worker_and_redis_on_sigterm(newcomer_env, tmp_path):
    """SIGTERM (``kill <pid>``, a CI time-out, systemd) ended the demo at once, without
    stopping its private redis-server: the server ran on as an orphan, its temporary
    directory stayed in /tmp. Ctrl-C (SIGINT) was handled, SIGTERM was not."""
    demo, out = start_demo(newcomer_env, tmp_path)
    pids: list[int] = []
    try:
        directory = demo_processes(out, pids)
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(60) != 0
        out.thread.join(10)
        assert wait_gone(pids, 10) == [], out.text
        assert not directory.exists(), out.text
        assert "interrupted" in out.text
    finally:
        kill_all(pids)
        out.close(demo)


@pytest.mark.skipif(not LINUX, reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.timeout(180)
def test_demo_killed_leaves_no_redis_server_running(newcomer_env, tmp_path):
    """kill -9 of the demo left its private redis-server running for ever (an orphan
    holding memory and a socket in /tmp); its workers did die (PR_SET_PDEATHSIG)."""
    demo, out = start_demo(newcomer_env, tmp_path)
    pids: list[int] = []
    directory = None
    try:
        directory = demo_processes(out, pids)
        demo.kill()
        demo.wait()
        assert wait_gone(pids, 15) == [], out.text
    finally:
        kill_all(pids)
        out.close(demo)
        if directory is not None:  # the demo had no time to delete it (its redis.log)
            shutil.rmtree(directory, ignore_errors=True)


# -- the shop's views ----------------------------------------------------------------------

SHOP_PROGRAM = textwrap.dedent(
    """
    from django.core.management import call_command
    from django.test import Client
    call_command("migrate", verbosity=0)
    client = Client(HTTP_HOST="localhost", raise_request_exception=False)
    for amount in AMOUNTS:
        created = client.post("/orders/", {"amount": amount})
        page = client.get("/")
        text = page.content.decode()
        print(amount, created.status_code, page.status_code, "must be a positive" in text)
    """
)


def shop(env: dict[str, str], program: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(MANAGE), "shell", "-c", program],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_shop_refuses_an_amount_its_column_cannot_hold(newcomer_env, redis_url):
    """The shop's "Create an order" form accepted an amount of 100,000,000 or more, which
    ``Order.amount`` (10 digits, 2 after the point) cannot hold: SQLite stored it anyway,
    and from then on the shop's home page answered 500 to everyone (InvalidOperation
    reading the row back); PostgreSQL refuses it with a 500 at once."""
    env = {**newcomer_env, "REDIS_URL": redis_url}
    amounts = ["12.5", "100000000", "99999999.995", "1e9"]
    done = shop(env, f"AMOUNTS = {amounts!r}\n" + SHOP_PROGRAM)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-4:] == [
        "12.5 302 200 False",
        "100000000 302 200 True",
        "99999999.995 302 200 True",
        "1e9 302 200 True",
    ], done.stderr[-3000:]


# -- the demo, continued -------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_demo_interrupted_does_not_wait_for_its_payments(newcomer_env, tmp_path):
    """After Ctrl-C the demo said "interrupted; the worker and Redis were stopped" and then
    hung until the last planned payment's moment (a minute with ``--deadline 60``): the
    payments' ThreadPoolExecutor threads, joined at exit, slept on and then paid orders
    (against the shop's default Redis, the demo's being gone)."""
    demo, out = start_demo(newcomer_env, tmp_path)
    try:
        out.wait_for(r"orders:\s+\d+ pending", 120)  # the payments are on their way
        demo.send_signal(signal.SIGINT)
        started = time.monotonic()
        demo.wait(90)
        assert time.monotonic() - started < 15, out.text
        assert "interrupted" in out.text
    finally:
        out.close(demo)


@pytest.mark.timeout(180)
def test_two_demos_started_together_on_a_new_database(newcomer_env, tmp_path):
    """Two demos started together on a new database both ran ``migrate``: the second failed
    with 'table "django_delayjobs_job" already exists' (or could not create
    django_migrations). Here the test holds SQLite's write lock until both are migrating,
    so that they always meet. The demos skip the system checks: Django 6's check that
    SQLite has JSON functions runs in a transaction that waits for that lock (30 s), then
    reports fields.E180, before the demo prints anything."""
    import sqlite3

    database = sqlite3.connect(newcomer_env["SHOP_SQLITE_PATH"], isolation_level=None)
    database.execute("PRAGMA journal_mode=WAL")
    database.execute("BEGIN IMMEDIATE")
    demos = []
    try:
        for n in range(2):
            extra = ("--orders", "2", "--deadline", "2", "--skip-checks")
            demos.append(start_demo(newcomer_env, tmp_path / str(n), *extra))
        for _, out in demos:
            out.wait_for(r"django-delayjobs demo", 60)
        time.sleep(3)  # both are in migrate, waiting for the lock
        database.execute("COMMIT")
        codes = [demo.wait(150) for demo, _ in demos]
        assert codes == [0, 0], "\n".join(out.text for _, out in demos)
    finally:
        database.close()
        for demo, out in demos:
            out.close(demo)


def test_the_report_commands_can_be_pasted_from_a_path_with_spaces(newcomer_env):
    """The report's closing commands (createsuperuser, runserver) printed the venv's python
    unquoted: from a venv or clone whose path has a space, pasting them ran "/tmp/my"."""
    program = (
        "import sys\n"
        "sys.executable = '/tmp/my venv/bin/python'\n"
        "from shop.management.commands.demo import Command\n"
        "Command().where_to_look('abc123')\n"
    )
    done = shop(newcomer_env, program)
    assert done.returncode == 0, done.stderr[-3000:]
    commands = [line.strip() for line in done.stdout.splitlines() if "manage.py" in line]
    assert shlex.split(commands[0])[0] == "/tmp/my venv/bin/python", done.stdout
    assert shlex.split(commands[0])[-1] == "createsuperuser", done.stdout
