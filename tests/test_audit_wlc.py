"""The worker process's life: a worker never looks alive while doing nothing, and it
says what went wrong once, not once a pass."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_delayjobs import schedule, schedule_many
from django_delayjobs.connection import get_engine
from django_delayjobs.models import Job, Status
from django_delayjobs.outcomes import Outcome
from django_delayjobs.services import build_job
from django_delayjobs.worker import Options, WorkerProcess
from tests.helpers import ROOT, database_down, start_worker, wait_for, worker_env
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def live_workers() -> bool:
    return get_engine().stats("default").live_workers >= 1


def test_an_action_that_holds_the_interpreter_still_stops_its_worker(redis_url, tmp_path):
    """C code that never releases the GIL stops every thread of the process: the
    housekeeping thread cannot fail it past MAX_RUN_SECONDS and a SIGTERM's handler never
    runs, so without a watchdog outside the interpreter the process would hang for good,
    alive to its supervisor. It exits 1, with every thread's traceback, and the job is
    not lost: its id is still in flight, delivered again once its lease ends."""
    env = {"DELAYJOBS_MAX_RUN_SECONDS": "1", "DELAYJOBS_SHUTDOWN_GRACE_SECONDS": "0"}
    worker = start_worker(redis_url, env=env, log=tmp_path / "w.log")
    try:
        wait_for(live_workers)
        job = schedule(tasks.hold_the_interpreter, in_=0)
        wait_for(lambda: Job.objects.get(pk=job.pk).status == Status.RUNNING)
        started = time.monotonic()
        assert worker.wait(30) == 1
        assert time.monotonic() - started < 15
    finally:
        if worker.poll() is None:
            worker.kill()
    log = (tmp_path / "w.log").read_text()
    assert "hold_the_interpreter" in log, log  # the traceback names the stuck action
    stats = get_engine().stats("default")
    assert stats.in_flight == 1
    assert Job.objects.get(pk=job.pk).status == Status.RUNNING


def test_a_lost_lease_is_logged_once_not_at_every_extension(settings, caplog):
    """Redis no longer holds a running job in flight (a promoter recovered its lease, as
    after a pause of the worker longer than the lease): the worker warns once, not every
    LEASE_SECONDS / 3 for as long as the action runs (an hour of warnings per job under
    MAX_RUN_SECONDS)."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "LEASE_SECONDS": 1.5}  # extended every 0.5 s
    job = schedule(tasks.slow, in_=0, args=["slow", 3.0])
    engine = get_engine()
    process = WorkerProcess(engine, Options(queues=["default"], tick=0.1))
    thread = threading.Thread(target=process.run)
    thread.start()
    try:
        wait_for(lambda: Job.objects.get(pk=job.pk).status == Status.RUNNING)
        # as recover_expired does (a reconcile sweep leaves an id in ready alone; one that
        # Redis holds nowhere it would put back in flight, and no lease would be lost)
        keys, job_id = engine.keys("default"), str(job.pk)
        engine.client.pipeline().zrem(keys.unack, job_id).lpush(keys.ready, job_id).sadd(
            keys.ready_set, job_id
        ).execute()
        wait_for(lambda: Job.objects.get(pk=job.pk).status == Status.SUCCEEDED)
    finally:
        process.stop()
        thread.join(30)
    lost = [r for r in caplog.records if "lost the lease" in r.getMessage()]
    assert len(lost) == 1, [r.getMessage() for r in lost]


@pytest.mark.parametrize(
    ("value", "reason"),
    [("a b", "use 1 to 64 letters"), (" , ", "no queue given"), ("x" * 65, "1 to 64")],
)
def test_a_bad_queues_option_says_why(value, reason):
    """argparse words a ValueError as "invalid queue_list value", dropping its reason."""
    with pytest.raises(CommandError, match="argument --queues") as raised:
        call_command("run_delayworker", "--queues", value)
    assert reason in str(raised.value)


#: How many migrations django_delayjobs has (a database never migrated lacks them all).
MIGRATIONS = len(list((ROOT / "django_delayjobs" / "migrations").glob("[0-9]*.py")))


@pytest.mark.parametrize(
    ("path", "said"),
    [("empty.sqlite3", f"lacks {MIGRATIONS} migration(s) of django_delayjobs (0001_initial to "),
     ("no-such-directory/db.sqlite3", "database 'default' is unavailable: unable to open")],
)  # fmt: skip
def test_a_database_never_migrated_is_named_as_such_at_start_up(redis_url, tmp_path, path,
                                                                said):  # fmt: skip
    """A worker started before ``migrate`` on a new database: not "unavailable"."""
    env = {**worker_env(redis_url), "DELAYJOBS_TEST_SQLITE": str(tmp_path / path)}
    env.pop("DELAYJOBS_TEST_DB_NAME", None)
    env.pop("DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "django", "run_delayworker", "--settings", "tests.settings"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert said in done.stderr.splitlines()[-1], done.stderr


def test_a_worker_backs_off_through_a_database_outage_though_redis_answers(settings, tmp_path):
    """With the database down, each delivery is handed back and the thread backs off, 0.2 s
    doubling to 5 s. A claim from Redis succeeding between them is no end of the outage:
    it reset the backoff, so that a thread handed back a job every 0.2 s (with
    PREFETCH = 1, or after each batch), a connection attempt each, for as long as the
    database stayed away."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "PREFETCH": 1}
    schedule_many([build_job(tasks.record, in_=0, args=[str(n)]) for n in range(20)])
    process = WorkerProcess(get_engine(), Options(queues=["default"], tick=0.1))
    thread = threading.Thread(target=process.run)
    with database_down(tmp_path):
        thread.start()
        try:
            time.sleep(3.5)  # the outage: 0.2 + 0.4 + 0.8 + 1.6 s of backoff fit in it
        finally:
            process.stop()
            thread.join(30)
    handed_back = process.stats.outcomes[Outcome.HANDED_BACK.value]
    assert 1 <= handed_back <= 6, handed_back
