"""Audit of the quick start, the example shop and packaging: failing tests (real bugs)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import venv
from pathlib import Path

import pytest

from tests.helpers import ROOT

MANAGE = ROOT / "example_project" / "manage.py"
LINUX = sys.platform.startswith("linux")

pytestmark = pytest.mark.slow


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
    """``manage.py demo`` with deadlines far enough away that it is still running."""
    process = subprocess.Popen(
        [sys.executable, str(MANAGE), "demo", "--orders", "4", "--deadline", "60",
         "--arrivals", "0.2", *extra, "--worker-log", str(tmp_path / "worker.log")],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    return process, Output(process)


@pytest.fixture
def shop_env(tmp_path: Path) -> dict[str, str]:
    """A newcomer's environment: no REDIS_URL (the demo starts its own), a fresh SQLite."""
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
def test_demo_stops_its_worker_and_redis_on_sigterm(shop_env, tmp_path):
    """SIGTERM (``kill <pid>``, a CI time-out, systemd) ended the demo at once, without
    stopping its private redis-server: the server ran on as an orphan, its temporary
    directory stayed in /tmp. Ctrl-C (SIGINT) was handled, SIGTERM was not."""
    demo, out = start_demo(shop_env, tmp_path)
    pids: list[int] = []
    try:
        server = int(out.wait_for(r"redis-server \(pid (\d+)", 120)[1])
        pids.append(server)
        directory = redis_dir(server)
        workers = out.wait_for(r"run_delayworker process\(es\) \(pid ([\d, ]+)\)", 120)[1]
        pids += [int(pid) for pid in workers.split(", ")]
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
def test_demo_killed_leaves_no_redis_server_running(shop_env, tmp_path):
    """kill -9 of the demo left its private redis-server running for ever (an orphan
    holding memory and a socket in /tmp); its workers did die (PR_SET_PDEATHSIG)."""
    demo, out = start_demo(shop_env, tmp_path)
    pids: list[int] = []
    try:
        server = int(out.wait_for(r"redis-server \(pid (\d+)", 120)[1])
        pids.append(server)
        workers = out.wait_for(r"run_delayworker process\(es\) \(pid ([\d, ]+)\)", 120)[1]
        pids += [int(pid) for pid in workers.split(", ")]
        demo.kill()
        demo.wait()
        assert wait_gone(pids, 15) == [], out.text
    finally:
        kill_all(pids)
        out.close(demo)


# -- dev.py ----------------------------------------------------------------------------

#: A stand-in for the venv's python: ready at once, 1.5 s to clean up after a signal.
COMMAND = """
import pathlib, signal, sys, time
here = pathlib.Path(sys.argv[0]).parent
def stop(signum, frame):
    time.sleep(1.5)  # the demo stops its worker and its Redis
    (here / "cleaned").write_text(str(signum))
    sys.exit(1)
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
(here / "ready").write_text("")
time.sleep(120)
"""

#: dev.py's demo task, with ensure_venv returning the stand-in (no install).
DRIVER = """
import sys
from pathlib import Path
sys.path.insert(0, {root!r})
import dev
dev.ensure_venv = lambda *args, **kwargs: Path({python!r})
sys.exit(dev.main(["demo"]))
"""


def start_dev_py(tmp_path: Path) -> subprocess.Popen[str]:
    python = tmp_path / "python"
    python.write_text(f"#!{sys.executable}\n{COMMAND}")
    python.chmod(0o755)
    driver = DRIVER.format(root=str(ROOT), python=str(python))
    process = subprocess.Popen(
        [sys.executable, "-c", driver], cwd=ROOT, start_new_session=True, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not (tmp_path / "ready").exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.02)
    return process


def end_group(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.communicate()


@pytest.mark.timeout(60)
def test_ctrl_c_on_dev_py_lets_the_command_clean_up(tmp_path):
    """Ctrl-C on ``python3 dev.py demo`` reaches dev.py and the demo (one process group);
    dev.py's ``subprocess.call`` then SIGKILLed the demo 0.25 s later, in the middle of
    stopping its worker and Redis (its directory was left in /tmp), and printed a
    KeyboardInterrupt traceback of its own."""
    process = start_dev_py(tmp_path)
    try:
        os.killpg(process.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        process.wait(20)
        deadline = time.monotonic() + 10
        while not (tmp_path / "cleaned").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "cleaned").exists(), "the command was killed while cleaning up"
        assert "Traceback" not in process.communicate()[1]
    finally:
        end_group(process)


@pytest.mark.timeout(60)
def test_sigterm_to_dev_py_reaches_the_command(tmp_path):
    """SIGTERM to ``python3 dev.py demo`` ended dev.py alone: the demo ran on, unsignalled,
    with no parent (a supervisor or CI that stops the quick start by pid stopped nothing)."""
    process = start_dev_py(tmp_path)
    try:
        process.send_signal(signal.SIGTERM)
        process.wait(20)
        deadline = time.monotonic() + 10
        while not (tmp_path / "cleaned").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "cleaned").read_text() == str(int(signal.SIGTERM))
    finally:
        end_group(process)


@pytest.mark.timeout(300)
def test_dev_py_repairs_a_venv_left_without_pip(tmp_path):
    """Ctrl-C during the first run's "dev.py: creating ..." (ensurepip takes seconds)
    leaves a venv with a python but no pip. Every later run then failed with "No module
    named pip" (a traceback), for ever: dev.py created the venv only when its python was
    missing. Here the install itself cannot succeed (no package index), but pip must be
    there again."""
    where = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(where)  # an interrupted creation
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(DELAYJOBS_VENV=str(where), PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path))
    done = subprocess.run([sys.executable, str(ROOT / "dev.py"), "lint"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=240)  # fmt: skip
    assert "No module named pip" not in done.stderr, done.stderr
    pip = subprocess.run([str(where / "bin" / "python"), "-m", "pip", "--version"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert pip.returncode == 0, pip.stderr


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


def test_shop_refuses_an_amount_its_column_cannot_hold(shop_env, redis_url):
    """The shop's "Create an order" form accepted an amount of 100,000,000 or more, which
    ``Order.amount`` (10 digits, 2 after the point) cannot hold: SQLite stored it anyway,
    and from then on the shop's home page answered 500 to everyone (InvalidOperation
    reading the row back); PostgreSQL refuses it with a 500 at once."""
    env = {**shop_env, "REDIS_URL": redis_url}
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
def test_demo_interrupted_does_not_wait_for_its_payments(shop_env, tmp_path):
    """After Ctrl-C the demo said "interrupted; the worker and Redis were stopped" and then
    hung until the last planned payment's moment (a minute with ``--deadline 60``): the
    payments' ThreadPoolExecutor threads, joined at exit, slept on and then paid orders
    (against the shop's default Redis, the demo's being gone)."""
    demo, out = start_demo(shop_env, tmp_path)
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
def test_two_demos_started_together_on_a_new_database(shop_env, tmp_path):
    """Two demos started together on a new database both ran ``migrate``: the second failed
    with 'table "django_delayjobs_job" already exists' (or could not create
    django_migrations). Here the test holds SQLite's write lock until both are migrating,
    so that they always meet."""
    import sqlite3

    database = sqlite3.connect(shop_env["SHOP_SQLITE_PATH"], isolation_level=None)
    database.execute("PRAGMA journal_mode=WAL")
    database.execute("BEGIN IMMEDIATE")
    demos = []
    try:
        for n in range(2):
            demos.append(
                start_demo(shop_env, tmp_path / str(n), "--orders", "2", "--deadline", "2")
            )
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


# -- install commands ----------------------------------------------------------------------

#: ``pip install 'django-delayjobs[x]'``: a requirement by name alone, which pip looks up on
#: PyPI (``... @ git+URL`` and a path are fine).
FROM_PYPI = re.compile(
    r"""pip install (['"]?)django-delayjobs(\[[^\]]*\])?\1(?=[\s`)]|$)(?!\s*@)"""
)


def test_no_install_command_looks_for_this_project_on_pypi():
    """django-delayjobs is not on PyPI ("install it from a clone", says the README), yet
    docs/callbacks.md, metrics.md, tasks.md, api.md, the README's metrics line and the
    messages for a missing extra (metrics/, run_delayworker --metrics-port, HTTP callbacks,
    the embedded Redis, the example's DATABASE_URL) said ``pip install
    'django-delayjobs[...]'``: "No matching distribution found", or, once someone else
    takes the name there, their package."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    files += sorted((ROOT / "django_delayjobs").rglob("*.py"))
    files += sorted((ROOT / "example_project").rglob("*.py"))
    found = [
        f"{path.relative_to(ROOT)}: {match[0]}"
        for path in files
        for match in FROM_PYPI.finditer(path.read_text())
    ]
    assert found == []


# -- an extra that is missing ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_callbacks_endpoint_without_urllib3_says_what_to_install(settings, monkeypatch):
    """Without the ``http`` extra (urllib3), POST callbacks/ answered 500: the
    ConfigurationError that names the extra escaped the view, so the API client got a
    server error page and the reason went only to the server's log."""
    from django_delayjobs.models import Job
    from tests.test_rest_helpers import client_for, make_user, url

    settings.DELAYJOBS = {**settings.DELAYJOBS, "HTTP_ALLOWED_HOSTS": ["hooks.example.com"]}
    monkeypatch.setitem(sys.modules, "urllib3", None)  # import urllib3 fails: not installed
    admin = client_for(make_user(superuser=True))
    response = admin.post(url("callbacks"), {"url": "https://hooks.example.com/x", "in": 60},
                          format="json")  # fmt: skip
    assert response.status_code == 501
    assert "django-delayjobs[http]" in response.json()["detail"]
    assert not Job.objects.exists()
