"""Audit of the entry points during outages: ``schedule()`` and ``schedule_many()`` while
Redis does not answer (one read timeout, the outbox keeps the job), the refusal when the
jobs' own database is unavailable (it names the database), and the health check's
database probe (bounded as ``bounded.read`` bounds a read)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from django_delayjobs import schedule
from django_delayjobs.connection import SOCKET_TIMEOUT, get_engine, reset_engine
from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.models import Job, Status
from django_delayjobs.reconcile import reconcile
from django_delayjobs.services import build_job, schedule_many
from tests.helpers import run_on_two_databases
from tests.testapp import tasks

from .test_rest_helpers import redis_state

pytestmark = pytest.mark.django_db(transaction=True)


# -- schedule() while Redis does not answer --------------------------------------------------


def frozen(server: EmbeddedRedis) -> None:
    """Stop ``server`` with a fresh engine whose connection is open: as in a web process
    that has not read the queue directory within ``DIRECTORY_TTL``."""
    assert server.pid is not None
    reset_engine()
    get_engine().client.ping()
    os.kill(server.pid, signal.SIGSTOP)


@pytest.mark.slow
def test_a_schedule_while_redis_does_not_answer_waits_for_one_timeout(own_jobs_redis, caplog):
    """Redis frozen: the add read the queue directory first (for shards of an older
    count) and timed out, then ran its script and timed out again: two timeouts for a
    ``schedule()`` once per ``DIRECTORY_TTL``. The job is committed all the same, and
    reconcile hands it to Redis once Redis answers again."""
    frozen(own_jobs_redis)
    started = time.monotonic()
    job = schedule(tasks.record, in_=600, args=["x"])
    took = time.monotonic() - started
    assert own_jobs_redis.pid is not None
    os.kill(own_jobs_redis.pid, signal.SIGCONT)
    assert took < 2 * SOCKET_TIMEOUT, took  # a second wait makes it 2 s at least
    assert Job.objects.get(pk=job.pk).status == Status.SCHEDULED  # returned, not raised
    assert "Redis is unavailable" in caplog.text  # said once for the outage
    reconcile(get_engine(), horizon=None)  # (a command sent may yet run once it resumes)
    assert redis_state(job) == "pending"


@pytest.mark.slow
def test_a_schedule_many_over_queues_while_redis_does_not_answer_waits_for_one_timeout(
    own_jobs_redis,
):
    """Redis frozen: ``schedule_many`` made one add per queue (and per batch), each
    waiting for the read timeout, on a Redis that had already not answered the first:
    three queues took 3 s and more. Every job is committed all the same."""
    jobs = [build_job(tasks.record, in_=600, args=["x"], queue=q) for q in ("a", "b", "c")]
    frozen(own_jobs_redis)
    started = time.monotonic()
    schedule_many(jobs)
    took = time.monotonic() - started
    assert own_jobs_redis.pid is not None
    os.kill(own_jobs_redis.pid, signal.SIGCONT)
    assert took < 2 * SOCKET_TIMEOUT, took  # a second wait makes it 2 s at least
    assert Job.objects.filter(status=Status.SCHEDULED).count() == 3
    reconcile(get_engine(), horizon=None)
    assert [redis_state(job) for job in jobs] == ["pending"] * 3


# -- the commands' refusal names the jobs' database ------------------------------------------

#: The project's database up; the jobs' ("jobs") a file SQLite cannot open (its directory
#: does not exist). Prints what each command refused with.
COMMANDS_JOBS_DOWN = """
import io
import json

import django

django.setup()
from django.core.management import CommandError, call_command

call_command("migrate", verbosity=0)
said = {}
for name, args, options in [
    ("delayjobs_reconcile", [], {}),
    ("delayjobs_prune", ["--older-than", "1d"], {}),
    ("run_delayworker", ["--burst"], {}),  # call_command skips the system checks
    ("run_delayworker", ["--burst"], {"skip_checks": False}),
]:
    try:
        call_command(name, *args, stdout=io.StringIO(), stderr=io.StringIO(), **options)
    except CommandError as exc:
        said[f"{name} {options}"] = str(exc)
print(json.dumps(said))
"""


def test_a_command_refused_for_the_jobs_database_names_its_alias(redis_url, tmp_path):
    """With the jobs on a database of their own that is down (the project's up), the
    commands said "the database is unavailable", not which one, while the admin's 503
    page names it: an operator looked at the project's database, which answered."""
    said = run_on_two_databases(COMMANDS_JOBS_DOWN, redis_url, tmp_path)
    assert len(said) == 4, said
    for command, message in said.items():
        assert message.startswith("the jobs database 'jobs' is unavailable: "), (command, message)
        assert "unable to open database file" in message, (command, message)
