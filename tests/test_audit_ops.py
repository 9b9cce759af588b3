"""Operational features: bugs found by the ops audit (retention, metrics, health, tasks)."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.models import Job, Status
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _clean_redis(redis_client):
    pass


def burst(*args: str) -> None:
    call_command("run_delayworker", "--burst", "-v", "0", *args)


def health(*args: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("delayjobs_health", *args, stdout=out)
        code = 0
    except CommandError as exc:
        code = exc.returncode
    return code, out.getvalue()


def test_pruning_dead_jobs_also_empties_their_redis_garbage():
    """operations.md: ``delayjobs_prune --older-than 90d --status dead`` deletes dead jobs;
    the health check's garbage is "dead jobs not yet requeued or purged". A pruned dead
    job is gone for good, yet its id stays in the Redis garbage set forever: the
    ``garbage:<queue>`` check keeps failing, the metrics keep counting it."""
    job = schedule(tasks.fail, in_=0, queue="orders", max_attempts=1)
    get_engine().heartbeat("orders", "w1", 30_000, {"host": "test"})
    burst("--queues", "orders")
    job.refresh_from_db()
    assert job.status == Status.DEAD
    assert get_engine().stats("orders").garbage == 1
    Job.objects.filter(pk=job.pk).update(finished_at=timezone.now() - timedelta(days=100))
    out = StringIO()
    call_command("delayjobs_prune", "--older-than", "90d", "--status", "dead", stdout=out)
    assert "deleted 1 dead jobs" in out.getvalue()
    assert not Job.objects.filter(pk=job.pk).exists()
    call_command("delayjobs_reconcile", stdout=StringIO())  # nor does a full reconcile
    code, text = health("--queues", "orders", "--max-garbage", "0")
    assert get_engine().stats("orders").garbage == 0, text
    assert code == 0, text
