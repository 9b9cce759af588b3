"""Helpers for tests that run real worker processes: start them, wait with a deadline."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from django.db import connection

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


def worker_env(redis_url: str, **extra: str) -> dict[str, str]:
    """Environment for a child process using this test's Redis and database."""
    env = {**os.environ, "REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1", **extra}
    if connection.vendor == "sqlite":
        env["DELAYJOBS_TEST_SQLITE"] = connection.settings_dict["NAME"]
    else:
        env["DELAYJOBS_TEST_DB_NAME"] = connection.settings_dict["NAME"]
    return env


def start_worker(redis_url: str, *args: str, env: dict[str, str] | None = None,
                 log: Path | None = None) -> subprocess.Popen[bytes]:  # fmt: skip
    """Start ``manage.py run_delayworker`` with the test settings."""
    cmd = [sys.executable, "-m", "django", "run_delayworker", "--settings", "tests.settings",
           "-v", "1", *args]  # fmt: skip
    env = {**worker_env(redis_url), **(env or {})}
    if log is None:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.STDOUT)  # fmt: skip
    with open(log, "ab") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


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
