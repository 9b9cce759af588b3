"""The lead's round: a job whose target object lives on a database that is down."""

from __future__ import annotations

import subprocess
import sys

import pytest

from django_delayjobs import schedule
from django_delayjobs.models import Status
from tests.helpers import ROOT, worker_env
from tests.testapp.models import Thing

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_target_on_a_database_that_is_down_is_retried_not_dead(redis_url, tmp_path):
    """A worker whose router puts Thing rows on a database it cannot reach (an SQLite file
    in a directory that does not exist: every connection fails with OperationalError).
    Reading the bound method's target failed, and the job went dead at once ("cannot run
    this job"), as if it could never run, though the next attempt could find the database
    back. It is a failed attempt, retried as the job says, like any query of the action."""
    job = schedule(Thing.objects.create(name="a").touch, in_=0, max_attempts=3)
    env = worker_env(redis_url, DELAYJOBS_TEST_THINGS_DB=str(tmp_path / "gone" / "t.sqlite3"))
    # --skip-checks: Django 6.1's system checks open every SQLite database, this one too.
    done = subprocess.run([sys.executable, "-m", "django", "run_delayworker", "--settings",
                           "tests.settings", "--burst", "--skip-checks", "-v", "0"],
                          cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.RETRYING, 1), (job.last_error, done.stderr)
    assert "OperationalError: unable to open database file" in job.last_error
    assert list(job.events.order_by("id").values_list("kind", flat=True)) == [
        "scheduled", "started", "failed"]  # fmt: skip
