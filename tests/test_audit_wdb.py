"""Hostile actions and database failures, run by a real worker in this process
(--burst): whatever an action does to its transaction, its connection or its own row,
every job ends scheduled, done or visibly dead with a true message."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from django_delayjobs import schedule_many
from django_delayjobs.models import Job, Status
from django_delayjobs.services import build_job
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True)


def burst() -> None:
    call_command("run_delayworker", "--burst", "-v", "0")


def run_first_then_two(action, *args) -> tuple[Job, list[Job]]:
    """Schedule ``action`` and two ``record`` jobs after it, all due; run them in one
    worker thread; return the rows as they ended."""
    past = timezone.now() - timedelta(seconds=1)
    first = build_job(action, at=past, args=list(args), max_attempts=2)
    after = [build_job(tasks.record, at=past + timedelta(milliseconds=n + 1),
                       args=[f"after {n}"]) for n in range(2)]  # fmt: skip
    schedule_many([first, *after])
    burst()
    first.refresh_from_db()
    for job in after:
        job.refresh_from_db()
    return first, after


def assert_the_next_jobs_committed(after: list[Job]) -> None:
    for job in after:
        assert (job.status, job.deliveries) == (Status.SUCCEEDED, 1), job.last_error
    labels = set(Record.objects.values_list("label", flat=True))
    assert {"after 0", "after 1"} <= labels, labels


@pytest.mark.parametrize("raise_after", [False, True], ids=["returns", "raises"])
@pytest.mark.parametrize("action", [tasks.leave_atomic_open, tasks.leave_atomic_open_outside],
                         ids=["atomic", "non-atomic"])  # fmt: skip
def test_an_action_that_leaves_an_atomic_block_open_fails_and_the_next_jobs_commit(
    action, raise_after
):
    """Left open, the block's transaction never commits: every later claim and outcome of
    the worker thread would go into it and be lost with it."""
    job, after = run_first_then_two(action, "left open", raise_after)
    assert (job.status, job.attempts, job.deliveries) == (Status.RETRYING, 1, 1)
    first_line = job.last_error.splitlines()[0]
    if raise_after:  # its own failure comes first
        assert first_line == "builtins.RuntimeError: failing with an atomic block left open"
    else:
        expected = ("django.db.transaction.TransactionManagementError: the action left 1 "
                    "transaction.atomic() block open")  # fmt: skip
        assert first_line.startswith(expected), first_line
    assert not Record.objects.filter(label="left open").exists()  # rolled back
    assert_the_next_jobs_committed(after)


@pytest.mark.parametrize(
    ("action", "args"),
    [
        (tasks.close_connection, ["closed", False]),
        (tasks.close_connection, ["closed", True]),
        (tasks.close_connection_in_own_block, ["closed"]),
    ],
    ids=["returns", "queries", "non-atomic-own-block"],
)
def test_an_action_that_closes_the_connection_fails_saying_so(action, args):
    """Its transaction is gone with the connection: the attempt failed, by the action's
    doing (not a lost database: no delivery is handed back), and the history says so."""
    job, after = run_first_then_two(action, *args)
    assert (job.status, job.attempts, job.deliveries) == (Status.RETRYING, 1, 1)
    assert "the action closed the database connection" in job.last_error.splitlines()[0], (
        job.last_error
    )
    assert not Record.objects.filter(label="closed").exists()
    assert_the_next_jobs_committed(after)


def test_an_action_that_deletes_its_own_job_row_fails_and_is_rolled_back():
    job, after = run_first_then_two(tasks.delete_own_job, "deleted")
    assert (job.status, job.attempts, job.deliveries) == (Status.RETRYING, 1, 1)
    assert "the action deleted its own job row" in job.last_error.splitlines()[0], job.last_error
    assert not Record.objects.filter(label="deleted").exists()
    assert_the_next_jobs_committed(after)


def test_a_non_atomic_action_that_deletes_its_own_job_row_is_dropped_saying_so(caplog):
    """Outside any transaction the deletion stands: nothing is left to record, and the id
    leaves Redis at once instead of coming back with its lease."""
    from django_delayjobs.connection import get_engine

    job = build_job(tasks.delete_own_job_outside, at=timezone.now(), args=["deleted"])
    schedule_many([job])
    burst()
    assert not Job.objects.filter(pk=job.pk).exists()
    assert Record.objects.filter(label="deleted").exists()
    stats = get_engine().stats("default")
    assert (stats.pending, stats.ready, stats.in_flight) == (0, 0, 0), stats
    assert "the job's row was deleted while its action ran" in caplog.text


# -- a database that hangs -----------------------------------------------------------------


@pytest.fixture
def hanging_database():
    """Point the jobs' database at a server on 127.0.0.1 that accepts connections and never
    answers (a database host that hangs: stopped with SIGSTOP, a dead NFS volume)."""
    import contextlib
    import socket
    import threading

    from django.db import connections

    conn = connections["default"]
    if conn.vendor != "postgresql":
        pytest.skip("a database server that hangs (PostgreSQL)")
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                accepted.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    conn.close()
    settings_dict = conn.settings_dict  # shared by every thread's wrapper of the alias
    saved = {key: settings_dict.get(key) for key in ("HOST", "PORT")}
    settings_dict.update(HOST="127.0.0.1", PORT=str(listener.getsockname()[1]))
    try:
        yield
    finally:
        settings_dict.update(saved)
        listener.close()
        for sock in accepted:  # a check still waiting gets its answer: the end
            sock.close()
        conn.close()


def within(seconds: float, call):
    """``call()``'s result, run in a thread that must end within ``seconds``."""
    import threading

    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    return out[0]


def test_the_health_checks_give_up_on_a_database_that_never_answers(hanging_database, client):
    from tests.test_health import beat, health, names

    beat()
    # Past the database's own bound (5 s): the check says the database did not answer.
    code, lines = within(20, lambda: health("--timeout", "8"))
    assert code == 1 and names(lines, "FAIL") == ["database"], lines
    line = next(line for line in lines if " database " in line)
    assert "did not answer within 5 s" in line, line
    # Within the default whole-check timeout (4 s): the database fails all the same, at
    # once while the read given up on above still waits.
    code, lines = within(20, health)
    assert code == 1 and "database" in names(lines, "FAIL"), lines
    line = next(line for line in lines if " database " in line)
    assert "the database did not answer" in line or "waiting on the database" in line, line
    response = within(20, lambda: client.get("/delayjobs/health/"))
    assert response.status_code == 503
    assert response.json()["checks"]["database"] == "fail"


# -- a read-only SQLite database -----------------------------------------------------------


@pytest.fixture
def read_only_sqlite():
    """Returns a function that makes the SQLite database file read-only (as after the
    filesystem was remounted read-only on an error) for new connections; undone after."""
    import os
    import subprocess

    from django.db import connections

    if connections["default"].vendor != "sqlite":
        pytest.skip("a read-only SQLite database file")
    path = connections["default"].settings_dict["NAME"]
    # Root ignores file modes: an immutable file refuses root's writes too.
    command = ["chattr", "+i", path] if os.geteuid() == 0 else ["chmod", "444", path]
    undo = ["chattr", "-i", path] if os.geteuid() == 0 else ["chmod", "644", path]

    def make_read_only() -> None:
        connections.close_all()
        if subprocess.run(command, capture_output=True).returncode:
            pytest.skip(f"cannot make the database file read-only here ({' '.join(command)})")

    try:
        yield make_read_only
    finally:
        subprocess.run(undo, capture_output=True)
        connections.close_all()


def test_a_read_only_sqlite_database_is_visible_and_costs_no_job(read_only_sqlite, caplog):
    """The worker hands the jobs back (nothing lost, no attempt used), says why once,
    stays alive, and the health check fails; once writable again the jobs run."""
    import logging
    import threading
    import time

    from django_delayjobs import health, schedule
    from django_delayjobs.connection import get_engine
    from django_delayjobs.worker import Options, WorkerProcess

    caplog.set_level(logging.WARNING, logger="django_delayjobs")
    jobs = [schedule(tasks.record, in_=0, args=[f"job {n}"], max_attempts=1) for n in range(2)]
    read_only_sqlite()
    process = WorkerProcess(get_engine(), Options(queues=["default"], tick=0.1))
    thread = threading.Thread(target=process.run)
    thread.start()
    try:
        time.sleep(4)  # due, delivered and refused several times
        database = health.check_database()
        assert thread.is_alive() and process.fatal is None
    finally:
        process.stop()
        thread.join(30)
    assert not database.ok and "refuses writes" in database.detail, database
    for job in jobs:
        job.refresh_from_db()
        assert (job.status, job.attempts) == (Status.SCHEDULED, 0)
    refused = [r.getMessage() for r in caplog.records if "readonly" in r.getMessage()]
    # One line per process, whichever of its threads met the outage first.
    worker = "worker: the jobs database 'default' is unavailable: attempt to write a readonly"
    assert any(line.startswith(worker) for line in refused), "\n".join(refused)
    # One line per loop and outage, not one per job and delivery.
    assert len(refused) == len({line.split(":")[0] for line in refused}), "\n".join(refused)
