"""Helpers for tests that run real worker processes: start them, wait with a deadline."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import redis
from django.db import connection, connections
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_delayjobs.engine import Engine

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout: float = 20.0, every: float = 0.02) -> T:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"still false after {timeout} s: {check}")
        time.sleep(every)


def add_pending(engine: Engine, queue: str, ids: list[str], margin_ms: float) -> float:
    """Add ``ids`` to ``queue`` (which holds no other pending id) due ``margin_ms`` from
    Redis's time, every one of them pending, and return their due time. An add that reached
    Redis after that time (a loaded machine paused the test between reading the time and
    the add) put them in ready at once, where no promote moves them: they are taken out
    and added again with a margin four times as long."""
    chunks = [ids[start : start + 1000] for start in range(0, len(ids), 1000)]
    while True:
        due = engine.server_time_ms() + margin_ms
        for chunk in chunks:
            engine.add(queue, dict.fromkeys(chunk, due))
        if engine.stats(queue).pending == len(ids):
            return due
        for chunk in chunks:
            engine.remove(queue, chunk)
        margin_ms = max(4 * margin_ms, 1)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = int(probe.getsockname()[1])
    probe.close()
    return port


def unreachable_engine() -> Engine:
    """An engine of a port nothing listens on. Its client makes no retries, as the app's
    own make none: redis-py's default three, with backoff, cost 3.5 s a refused call."""
    client = redis.Redis(port=free_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    return Engine(client, prefix="t")


def redis_answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def worker_env(redis_url: str, **extra: str) -> dict[str, str]:
    """Environment for a child process using this test's Redis and database."""
    env = {**os.environ, "REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1", **extra}
    if connection.vendor == "sqlite":
        env["DELAYJOBS_TEST_SQLITE"] = connection.settings_dict["NAME"]
    else:
        env["DELAYJOBS_TEST_DB_NAME"] = connection.settings_dict["NAME"]
    return env


def run_in_web_process(script: str, *args: str, redis_url: str,
                       env: dict[str, str] | None = None, timeout: float = 60
                       ) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """Run ``python -c script *args`` as a process of the test project that is not a
    worker (Django set up by the script, this test's Redis and database, ``env`` on top);
    its output is captured as text, its exit code left to the caller."""
    env = {**worker_env(redis_url), "DJANGO_SETTINGS_MODULE": "tests.settings", **(env or {})}
    return subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


_TEST_PROCESS = os.getpid()


def run_on_two_databases(script: str, redis_url: str, tmp_path: Path, *, jobs_down: bool = True
                         ) -> Any:  # fmt: skip
    """Run ``script`` in a Python of its own, with the jobs on a SQLite database of their
    own (``DATABASES["jobs"]``), by default a file that cannot be opened, the project's
    database up; return the JSON of the last line it prints."""
    jobs = tmp_path / "missing" / "jobs.sqlite3" if jobs_down else tmp_path / "jobs.sqlite3"
    env = {**worker_env(redis_url), "DJANGO_SETTINGS_MODULE": "tests.settings",
           "DELAYJOBS_TEST_SQLITE": str(tmp_path / "default.sqlite3"),
           "DELAYJOBS_TEST_JOBS_DB": str(jobs)}  # fmt: skip
    env.pop("DATABASE_URL", None)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def in_thread(fn: Callable[[], Any], out: list[Any], name: str | None = None) -> threading.Thread:
    """Start ``fn`` in a thread of its own connection; its result or exception goes to ``out``."""

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # checked by the test
            out.append(exc)
        finally:
            connection.close()

    started = threading.Thread(target=run, name=name)
    started.start()
    return started


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it if the test process dies first (and
    exit at once if it died between the fork and the prctl, which then sends nothing)."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != _TEST_PROCESS:
        os._exit(1)


def start_worker(redis_url: str, *args: str, env: dict[str, str] | None = None,
                 log: Path | None = None) -> subprocess.Popen[bytes]:  # fmt: skip
    """Start ``manage.py run_delayworker`` with the test settings."""
    cmd = [sys.executable, "-m", "django", "run_delayworker", "--settings", "tests.settings",
           "-v", "1", *args]  # fmt: skip
    env = {**worker_env(redis_url), **(env or {})}
    if log is None:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)  # fmt: skip
    with open(log, "ab") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=_die_with_parent)  # fmt: skip


def burst_worker(
    redis_url: str, log: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> int:
    """Run a ``--burst`` worker process (``start_worker``) to its end, its output in
    ``log``, and return its exit code; one still running after ``timeout`` seconds is
    killed, and ``TimeoutExpired`` raised."""
    return exit_code(start_worker(redis_url, "--burst", *args, env=env, log=log), timeout)


def exit_code(worker: subprocess.Popen[bytes], timeout: float) -> int:
    """The worker's exit code within ``timeout`` seconds (killed if it takes longer, and
    ``TimeoutExpired`` raised): not left running into the next tests."""
    try:
        return worker.wait(timeout)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def stop(process: subprocess.Popen[bytes], timeout: float = 30) -> int:
    """SIGTERM the process and return its exit code (SIGKILL if it hangs)."""
    if process.poll() is None:
        process.terminate()
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
    return process.returncode


class TcpProxy:
    """Forwards 127.0.0.1:<port> to a server; ``down()`` refuses and cuts connections,
    ``silence()`` stops forwarding on connections while keeping them open."""

    def __init__(self, host: str, port: int) -> None:
        import socket

        self.target = (host, port)
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.listener: socket.socket | None = None
        self.conns: list[socket.socket] = []
        self.silent_on: bytes | None = None

    def silence(self, on: bytes = b"") -> None:
        """From now on, a connection whose client sends bytes holding ``on`` (any, for
        b"") stops forwarding both ways from that moment, its sockets left open: a
        network cut that sends no reset, met by a request under way."""
        self.silent_on = on

    def up(self) -> None:
        import socket
        import threading

        if self.listener:
            return
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", self.port))
        self.listener.listen(64)
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def down(self) -> None:
        import socket

        if self.listener:
            # Wakes the accept() under way (close() alone leaves it listening on Linux, and
            # the next up() finds the port in use).
            with contextlib.suppress(OSError):
                self.listener.shutdown(socket.SHUT_RDWR)
            self.listener.close()
            self.listener = None
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        self.conns.clear()

    def _accept(self, listener: object) -> None:
        import socket
        import threading

        assert isinstance(listener, socket.socket)
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            if listener is not self.listener:  # an accept() that outlived down()
                client.close()
                return
            server = socket.create_connection(self.target)
            self.conns += [client, server]
            silent = threading.Event()  # this connection's, both ways
            for a, b, outgoing in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pipe, args=(a, b, silent, outgoing),
                                 daemon=True).start()  # fmt: skip

    def _pipe(self, src: object, dst: object, silent: threading.Event, outgoing: bool) -> None:
        import socket

        assert isinstance(src, socket.socket) and isinstance(dst, socket.socket)
        try:
            while data := src.recv(65536):
                if outgoing and self.silent_on is not None and self.silent_on in data:
                    silent.set()
                if not silent.is_set():
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


def age_rows(minutes: float = 1.0) -> None:
    """Make every job look created ``minutes`` ago: reconcile counts a missing job as lost
    only once it is older than ``reconcile.FRESH`` (a young one's add may be on its way)."""
    from datetime import timedelta

    from django.utils import timezone

    from django_delayjobs.models import Job

    Job.objects.update(created_at=timezone.now() - timedelta(minutes=minutes))


def set_read_only(on: bool) -> None:
    """Make new sessions of the test database read-only (or not again), as a failover
    onto a standby would, and end the worker's sessions so that they reconnect."""
    with connection.cursor() as cursor:
        if not on:  # this session may be a read-only one, which ALTER DATABASE refuses
            cursor.execute("SET default_transaction_read_only = off")
        name = connection.ops.quote_name(connection.settings_dict["NAME"])
        setting = "default_transaction_read_only"
        change = f"SET {setting} = on" if on else f"RESET {setting}"
        cursor.execute(f"ALTER DATABASE {name} {change}")
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
            "current_database() AND pid <> pg_backend_pid()"
        )


@contextlib.contextmanager
def database_down(tmp_path: Path) -> Iterator[None]:
    """Point the default connection at a database that cannot be opened."""
    conn = connections["default"]
    conn.close()
    old = conn.settings_dict["NAME"]
    missing = "delayjobs_no_such_db"
    conn.settings_dict["NAME"] = (
        str(tmp_path / "missing" / "db.sqlite3") if conn.vendor == "sqlite" else missing
    )
    try:
        yield
    finally:
        conn.close()
        conn.settings_dict["NAME"] = old


def confirm_purge(client: Any, url: str, data: dict[str, Any], **kwargs: Any) -> Any:
    """Post ``data`` to a purge as a browser does: ask, then post the confirmation page's
    time (``shown``, signed) with ``post=yes``."""
    asked = {name: value for name, value in data.items() if name != "post"}
    page = client.post(url, asked).content.decode()
    shown = re.search(r'name="shown" value="([^"]+)"', page)
    assert shown is not None, page[-2000:]
    return client.post(url, {**asked, "post": "yes", "shown": shown[1]}, **kwargs)


def purge_with_a_death_between(
    client: Any, page: str, shown: Any, later: Any, die: Callable[[Any], None]
) -> Any:
    """Ask to purge ``shown`` (dead) from ``page`` ("select all" on the job changelist, or
    the queue page, asked for ``later`` too), check that the confirmation lists ``shown``
    alone, let ``die(later)``, then post the confirmation's hidden fields back as a
    browser does; return the response, redirects followed."""
    from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
    from django.urls import reverse

    if page == "select all":
        url = reverse("admin:django_delayjobs_job_changelist")
        ask = {"action": "purge_dead", ACTION_CHECKBOX_NAME: [str(shown.pk)], "index": "0",
               "select_across": "1"}  # fmt: skip
    else:
        url = reverse("admin:django_delayjobs_queues_purge")
        ask = {"job": [str(shown.pk), str(later.pk)]}
    html = client.post(url, ask).content.decode()
    assert f"<code>{shown.pk}</code>" in html and f"<code>{later.pk}</code>" not in html
    die(later)
    form: dict[str, list[str]] = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', html):
        form.setdefault(name, []).append(value)
    return client.post(url, form, follow=True)


def planted_callback(stored: dict[str, Any], **options: Any) -> Any:
    """A callback job whose row holds ``stored`` as its request, written past the door (as
    an older version or a manual edit would): scheduled with a request the door takes,
    then its row's kwargs replaced. ``options`` go to ``schedule``."""
    from django_delayjobs import schedule
    from django_delayjobs.callbacks.action import deliver
    from django_delayjobs.models import Job

    sendable = {"method": "POST", "url": "http://planted.invalid/"}
    job = schedule(deliver, in_=0, kwargs=sendable, **options)
    Job.objects.filter(pk=job.pk).update(kwargs=stored)
    job.kwargs = stored
    return job


class WritesLocked:
    """The jobs' table locked against writes by another connection from ``hold()`` to
    ``release()``; it still answers reads. A claim's ``UPDATE`` waits for it: on SQLite
    for the whole database's write lock, and is refused past the busy timeout."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.holder: threading.Thread | None = None

    def hold(self) -> None:
        locked = threading.Event()

        def hold() -> None:
            if connection.vendor == "sqlite":
                other = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
                other.execute("BEGIN IMMEDIATE")
            else:
                import psycopg  # PostgreSQL's only

                from django_delayjobs.models import Job

                other = psycopg.connect(**connection.get_connection_params())
                # Not the row alone: the claim skips a locked row (SKIP LOCKED) at once.
                other.execute(f'LOCK TABLE "{Job._meta.db_table}" IN EXCLUSIVE MODE')
            locked.set()
            self.released.wait(60)
            other.rollback()
            other.close()

        self.holder = threading.Thread(target=hold)
        self.holder.start()
        assert locked.wait(10)

    def release(self) -> None:
        self.released.set()
        if self.holder is not None:
            self.holder.join(10)
