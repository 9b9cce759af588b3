"""The management commands as an operator runs them: output to a pipe that was closed
(``| head -1``), no stdout at all, an ASCII-only stdout, odd option values. Real servers
only (the suite's Redis, the test database); worker processes are stopped by pid."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import TextIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.models import Job, Status
from tests.helpers import ROOT, _die_with_parent, stop, worker_env
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def closed_pipe() -> Iterator[TextIO]:
    """The write end of a pipe whose reader has gone (``| head -1`` once head exited),
    line-buffered as a stdout is under PYTHONUNBUFFERED or on a terminal."""
    read, write = os.pipe()
    os.close(read)
    stream = open(write, "w", buffering=1, encoding="utf-8")  # noqa: SIM115
    try:
        yield stream
    finally:
        with contextlib.suppress(BrokenPipeError):  # what the old code left in its buffer
            stream.close()


def test_stats_into_a_closed_pipe_ends_quietly(closed_pipe):
    """``delayjobs_stats | head -1``: the first line head did not read ended the command
    with a BrokenPipeError traceback. Now the rest of the table is dropped quietly."""
    get_engine().add("a", {"x": 10**13})
    call_command("delayjobs_stats", stdout=closed_pipe)


def test_health_into_a_closed_pipe_keeps_its_exit_code(closed_pipe):
    """The exit code is what a probe reads: a pipe closed after the first line must
    not turn a failing check into a traceback (nor a passing one into exit 1)."""
    with pytest.raises(CommandError) as failed:
        call_command("delayjobs_health", stdout=closed_pipe)  # no worker: one check fails
    assert failed.value.returncode == 1
    call_command("delayjobs_health", "--min-workers", "0", stdout=closed_pipe)


def test_health_on_an_ascii_stdout_shows_a_non_ascii_error_escaped(settings, tmp_path):
    """``PYTHONIOENCODING=ascii`` (or a stdout opened as ASCII) and an error text with a
    character it cannot encode (a path, a host, a localised database message): the
    command died of a UnicodeEncodeError instead of saying which check failed."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": f"unix://{tmp_path}/r\xe9dis.sock"}
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="ascii", errors="strict", write_through=True)
    with pytest.raises(CommandError) as failed:
        call_command("delayjobs_health", stdout=out)
    assert failed.value.returncode == 1
    lines = raw.getvalue().decode("ascii").splitlines()
    assert lines[0].startswith("FAIL redis") and "r\\xe9dis.sock" in lines[0], lines


def run_burst(stdout_fd_closed: bool) -> subprocess.CompletedProcess[bytes]:
    """``run_delayworker --burst`` whose stdout is a pipe nobody reads (its reader, a
    log shipper, has exited) or, with ``stdout_fd_closed``, no stdout at all (``>&-``)."""
    from django.conf import settings

    def child_setup() -> None:
        _die_with_parent()
        if stdout_fd_closed:
            os.close(1)

    cmd = [sys.executable, "-m", "django", "run_delayworker", "--settings", "tests.settings",
           "-v", "1", "--burst"]  # fmt: skip
    env = worker_env(settings.DELAYJOBS["REDIS_URL"])
    read, write = os.pipe()
    os.close(read)
    try:
        child = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=write, stderr=subprocess.PIPE,
                                 preexec_fn=child_setup)  # fmt: skip
    finally:
        os.close(write)
    try:
        _, err = child.communicate(timeout=60)
    finally:
        stop(child)
    return subprocess.CompletedProcess(cmd, child.returncode, b"", err)


@pytest.mark.slow
@pytest.mark.parametrize("no_stdout", [False, True], ids=["closed-pipe", "no-stdout"])
def test_a_worker_whose_stdout_is_gone_still_runs_its_jobs(no_stdout):
    """The worker's start line met a pipe whose reader had gone (or no stdout at all):
    the worker died before running a job, and a supervisor restarted it into the same
    death. Its stdout only says it started; it now runs its jobs as it would."""
    job = schedule(tasks.record, in_=0, args=["ran"])
    done = run_burst(no_stdout)
    err = done.stderr.decode(errors="replace")
    assert done.returncode == 0, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED


def start_command(*args: str, redis_url: str | None = None) -> subprocess.Popen[bytes]:
    """``manage.py <args>`` with the test settings, its SIGINT as at a terminal (a child
    started by a shell script in the background would ignore it)."""
    from django.conf import settings

    def child_setup() -> None:
        _die_with_parent()
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    cmd = [sys.executable, "-m", "django", *args, "--settings", "tests.settings"]
    env = worker_env(redis_url or settings.DELAYJOBS["REDIS_URL"])
    return subprocess.Popen(cmd, cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=child_setup)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_a_prune_stopped_by_a_signal_ends_its_batch_and_says_so(signum):
    """SIGTERM (a deploy, a timer's timeout) or Ctrl-C during a prune: SIGTERM ended the
    process wherever it was, SIGINT with a KeyboardInterrupt traceback, both without a
    word of what had been deleted, and either could land between a batch's commit and
    the purge of its dead ids from the Redis garbage, which then counted deleted jobs for
    ever. Now the batch under way is finished, the prune stops at once (not after its
    pace's pause) and says what it deleted, with the signal's exit code."""
    from tests.test_retention import dead_in_garbage

    dead_in_garbage("orders", 10)
    prune = start_command("delayjobs_prune", "--older-than", "30d", "--status", "dead",
                          "--batch", "4", "--max-rate", "1")  # then a pause of 4 s  # fmt: skip
    try:
        assert prune.stdout is not None
        first = prune.stdout.readline().decode()
        assert "batch 1: 4 job(s)" in first, first
        prune.send_signal(signum)
        out, err = prune.communicate(timeout=3)  # well before the pause's end
    finally:
        stop(prune)
    assert prune.returncode == 128 + signum, err.decode()
    assert "Traceback" not in err.decode(), err.decode()
    stopped = f"stopped by {signal.Signals(signum).name}: deleted 4 dead jobs"
    assert stopped in (out + err).decode(), (out + err).decode()
    left = set(Job.objects.values_list("pk", flat=True))
    assert len(left) == 6
    assert get_engine().stats("orders").garbage == 6  # the deleted ones' ids purged


def test_stats_shows_a_queue_named_twice_once():
    """``delayjobs_stats orders orders`` (a list pasted twice, a shell variable that
    repeats a name) printed the same row twice, so the table's rows no longer added up
    to the deployment's jobs; ``--queues a,a`` of the other commands serves one queue."""
    get_engine().add("orders", {"x": 10**13})
    get_engine().add("other", {"y": 10**13})
    out = io.StringIO()
    call_command("delayjobs_stats", "orders", "other", "orders", stdout=out)
    rows = [line.split()[0] for line in out.getvalue().splitlines()[1:]]
    assert rows == ["orders", "other"]


@pytest.mark.parametrize("command", [
    ["delayjobs_reconcile"],
    ["delayjobs_prune", "--older-than", "30d"],
    ["delayjobs_prune", "--older-than", "30d", "--dry-run"],
])  # fmt: skip
def test_a_database_without_the_apps_migrations_is_named_so(command):
    """A new version deployed before ``migrate``: reconcile and prune said "the database
    is unavailable: no such column ...", sending the operator after a database that
    answers. They now say which migrations are missing, as run_delayworker does."""
    call_command("migrate", "django_delayjobs", "0002", verbosity=0)
    try:
        with pytest.raises(CommandError) as failed:
            call_command(*command, stdout=io.StringIO())
    finally:  # every app: going back unapplied testapp's migrations that depend on ours
        call_command("migrate", verbosity=0)
    message = str(failed.value)
    assert "the jobs database 'default' lacks" in message, message
    assert "run manage.py migrate (" in message, message


@pytest.mark.slow
@pytest.mark.parametrize("command", ["delayjobs_stats", "delayjobs_reconcile", "delayjobs_health"])
def test_ctrl_c_while_redis_does_not_answer_ends_with_one_line(command):
    """Ctrl-C on a command that waits for a Redis that accepted the connection and does
    not answer (frozen, overloaded): a KeyboardInterrupt traceback of thirty lines
    through redis-py. Now one line on stderr, and exit code 130 as a shell's."""
    with socket.create_server(("127.0.0.1", 0)) as frozen:
        port = frozen.getsockname()[1]
        child = start_command(command, redis_url=f"redis://127.0.0.1:{port}/0")
        try:
            frozen.settimeout(30)
            conn, _ = frozen.accept()  # the command now waits for Redis's answer
            with conn:
                child.send_signal(signal.SIGINT)
                _, err = child.communicate(timeout=10)
        finally:
            stop(child)
    assert child.returncode == 130, err.decode()
    assert err.decode().strip() == "interrupted", err.decode()
