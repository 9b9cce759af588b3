"""Retention: ``delayjobs_prune`` and the workers' automatic pruning (PRUNE_AFTER_SECONDS)."""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_delayjobs import retention, schedule
from django_delayjobs.checks import check_settings
from django_delayjobs.connection import get_engine
from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.engine import Engine
from django_delayjobs.models import Job, JobEvent, Status
from django_delayjobs.retention import AutoPrune, parse_duration
from tests.helpers import database_down, start_worker, stop, wait_for
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

OLD = timedelta(days=40)


def make(status: str, finished_ago: timedelta | None = OLD, events: int = 2) -> Job:
    now = timezone.now()
    job = Job.objects.create(
        queue="default", action="tests.nothing", run_at=now - timedelta(days=100),
        status=status, finished_at=None if finished_ago is None else now - finished_ago,
    )  # fmt: skip
    for n in range(events):
        JobEvent.objects.create(job=job, kind="scheduled", message=f"event {n}")
    return job


def prune(*args: str) -> str:
    out = StringIO()
    call_command("delayjobs_prune", *args, stdout=out)
    return out.getvalue()


def settings_with(**values: object) -> override_settings:
    from django.conf import settings

    return override_settings(DELAYJOBS={**settings.DELAYJOBS, **values})


# -- hostile input ---------------------------------------------------------------------


@pytest.mark.parametrize("age", [
    "", " ", "30", "d", "-5d", "+5d", "0d", "0s", "1.5d", "30 d", "30D", "1w", "30dd",
    "\uff13\uff10d", "1" * 13 + "s", "36501d", "99999999999h", "30d;drop", "nan", "inf",
])  # fmt: skip
def test_bad_durations_are_command_errors(age):
    with pytest.raises(CommandError, match=r"duration|too long|more than 0"):
        prune(f"--older-than={age}")


@pytest.mark.parametrize("statuses", ["", ",", "running", "scheduled", "retrying",
                                      "succeeded,running", "bogus", "SUCCEEDED"])  # fmt: skip
def test_statuses_other_than_finished_ones_are_refused(statuses):
    job = make(Status.RUNNING)
    with pytest.raises(CommandError, match="status"):
        prune("--older-than", "1d", "--status", statuses)
    assert Job.objects.filter(pk=job.pk).exists()


@pytest.mark.parametrize("batch", ["0", "-1", "10001", "99999999999999999999"])
def test_bad_batch_sizes_are_command_errors(batch):
    with pytest.raises(CommandError, match="batch"):
        prune("--older-than", "1d", f"--batch={batch}")


@pytest.mark.parametrize("rate", ["-1", "-5", "1000001", "1.5", "nan", "inf", "", "fast",
                                  "99999999999999999999"])  # fmt: skip
def test_bad_rates_are_command_errors(rate):
    job = make(Status.SUCCEEDED)
    with pytest.raises(CommandError, match="rate"):
        prune("--older-than", "1d", f"--max-rate={rate}")
    assert Job.objects.filter(pk=job.pk).exists()


def test_durations_that_are_accepted():
    assert parse_duration("30d") == timedelta(days=30)
    assert parse_duration("12h") == timedelta(hours=12)
    assert parse_duration(" 90m ") == timedelta(minutes=90)
    assert parse_duration("3600s") == timedelta(hours=1)
    assert parse_duration("36500d") == timedelta(days=36500)


# -- what is deleted ---------------------------------------------------------------------


def test_prunes_only_old_finished_jobs_of_the_named_statuses_with_their_events():
    gone = [make(Status.SUCCEEDED), make(Status.CANCELLED), make(Status.SKIPPED)]
    kept = [
        make(Status.DEAD),  # dead: kept unless named
        make(Status.SUCCEEDED, timedelta(days=20)),  # too recent
        make(Status.SUCCEEDED, None),  # no finish time
        # Not finished, whatever finished_at says (a requeued row, a hand-edited one):
        make(Status.SCHEDULED),
        make(Status.RUNNING),
        make(Status.RETRYING),
    ]
    out = prune("--older-than", "30d")
    assert "deleted 3 succeeded,cancelled,skipped jobs" in out
    assert "with 6 event(s)" in out
    assert not Job.objects.filter(pk__in=[j.pk for j in gone]).exists()
    assert not JobEvent.objects.filter(job_id__in=[j.pk for j in gone]).exists()
    assert set(Job.objects.values_list("pk", flat=True)) == {j.pk for j in kept}
    assert JobEvent.objects.count() == 2 * len(kept)


def test_dead_jobs_are_pruned_only_when_named():
    dead, done = make(Status.DEAD), make(Status.SUCCEEDED)
    out = prune("--older-than", "30d", "--status", "dead")
    assert "deleted 1 dead jobs" in out
    assert list(Job.objects.values_list("pk", flat=True)) == [done.pk]
    assert not JobEvent.objects.filter(job_id=dead.pk).exists()


def dead_in_garbage(queue: str, n: int = 1) -> list[Job]:
    """``n`` jobs that died in a worker (their ids in the queue's Redis garbage), old."""
    jobs = [schedule(tasks.fail, in_=0, queue=queue, max_attempts=1) for _ in range(n)]
    call_command("run_delayworker", "--burst", "-v", "0", "--queues", queue)
    assert {j.status for j in Job.objects.filter(pk__in=[j.pk for j in jobs])} == {Status.DEAD}
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(finished_at=timezone.now() - OLD)
    return jobs


def test_pruning_dead_jobs_purges_their_ids_from_the_redis_garbage():
    """A pruned dead job is gone for good: the health check's ``garbage:<queue>``, the
    metrics and the admin must stop counting it (reconcile would not remove it)."""
    dead_in_garbage("orders", 2)
    assert get_engine().stats("orders").garbage == 2
    out = prune("--older-than", "30d", "--status", "dead", "--batch", "1")
    assert "deleted 2 dead jobs" in out
    assert not Job.objects.exists()
    assert get_engine().stats("orders").garbage == 0
    get_engine().heartbeat("orders", "w1", 30_000, {"host": "test"})  # the workers check
    health = StringIO()
    call_command("delayjobs_health", "--queues", "orders", "--max-garbage", "0", stdout=health)
    assert "ok   garbage:orders" in health.getvalue()


def test_redis_down_while_pruning_dead_jobs_leaves_their_ids_and_one_warning(
    tmp_path, settings, caplog
):
    """The rows are deleted already: Redis down must not fail or stop the prune; how many
    ids stay in the garbage is said once, however many batches there were."""
    server = EmbeddedRedis(tmp_path / "redis")
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": server.start()}
    try:
        dead_in_garbage("orders", 3)
        server.stop()
        with caplog.at_level(logging.WARNING, logger="django_delayjobs.retention"):
            out = prune("--older-than", "30d", "--status", "dead", "--batch", "1")
    finally:
        server.close()
    assert "deleted 3 dead jobs" in out and "in 3 batch(es)" in out
    assert not Job.objects.exists()
    warnings = [r.getMessage() for r in caplog.records if r.name == "django_delayjobs.retention"]
    assert len(warnings) == 1
    assert "left 3 deleted dead job id(s) in the Redis garbage" in warnings[0]


def test_redis_settings_that_cannot_work_while_pruning_dead_jobs_warn_once(settings, caplog):
    """As with Redis down: settings that give no Redis client (a ``CACHE_ALIAS`` that is
    not django-redis's) raised out of the garbage purge after the first batch."""
    for _ in range(3):
        make(Status.DEAD, events=0)
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    settings.DELAYJOBS = {**settings.DELAYJOBS, "CACHE_ALIAS": "default"}
    with caplog.at_level(logging.WARNING, logger="django_delayjobs.retention"):
        out = prune("--older-than", "30d", "--status", "dead", "--batch", "1")
    assert "deleted 3 dead jobs" in out and not Job.objects.exists()
    warnings = [r.getMessage() for r in caplog.records if r.name == "django_delayjobs.retention"]
    assert len(warnings) == 1 and "left 3 deleted dead job id(s)" in warnings[0]
    assert "is not a django-redis cache" in warnings[0]


RATE = f"(at most {retention.DEFAULT_RATE} jobs/s)"


def test_batches_report_progress_and_a_summary():
    for _ in range(25):
        make(Status.SUCCEEDED, events=1)
    out = prune("--older-than", "1h", "--batch", "10", "-v", "2")
    lines = out.splitlines()
    assert [line.split(" ", 1)[1] for line in lines[:3]] == [
        "batch 1: 10 job(s), 10 event(s) deleted so far",
        "batch 2: 20 job(s), 20 event(s) deleted so far",
        "batch 3: 25 job(s), 25 event(s) deleted so far",
    ]
    assert lines[-1].endswith(f"with 25 event(s), in 3 batch(es) {RATE}")
    assert not Job.objects.exists()


def test_progress_is_the_first_batch_then_every_few_seconds_by_default():
    for _ in range(25):
        make(Status.SUCCEEDED, events=1)
    out = prune("--older-than", "1h", "--batch", "10")
    lines = out.splitlines()
    assert len(lines) == 2, out  # the three batches took less than PROGRESS_EVERY
    assert lines[0].endswith("batch 1: 10 job(s), 10 event(s) deleted so far")
    assert lines[1].endswith(f"with 25 event(s), in 3 batch(es) {RATE}")


def test_the_default_pace_and_batch():
    for _ in range(retention.DEFAULT_BATCH + 1):
        make(Status.SUCCEEDED, events=0)
    last = prune("--older-than", "1h").splitlines()[-1]
    assert last.endswith(f"in 2 batch(es) {RATE}"), last


def test_max_rate_paces_the_batches():
    for _ in range(30):
        make(Status.SUCCEEDED, events=1)
    started = time.monotonic()
    out = prune("--older-than", "1h", "--batch", "10", "--max-rate", "20")
    took = time.monotonic() - started
    # 10 jobs at 20 jobs/s: each of the three full batches takes 0.5 s at least, the
    # fourth (empty) one ends the prune.
    assert took >= 1.5, took
    assert out.splitlines()[-1].endswith("in 3 batch(es) (at most 20 jobs/s)")
    assert not Job.objects.exists()


def test_max_rate_0_is_unpaced():
    for _ in range(30):
        make(Status.SUCCEEDED, events=0)
    started = time.monotonic()
    out = prune("--older-than", "1h", "--batch", "1", "--max-rate", "0")
    assert time.monotonic() - started < 10  # at 1 job/s, 29 s
    assert out.splitlines()[-1].endswith("in 30 batch(es)")


@pytest.mark.parametrize("rate", [-1, 1_000_001, 2.5, True, "10"])
def test_prune_refuses_bad_rates_before_deleting(rate):
    job = make(Status.SUCCEEDED)
    with pytest.raises(ValueError, match="rate"):
        retention.prune(timezone.now(), batch=1, max_rate=rate)
    assert Job.objects.filter(pk=job.pk).exists()


def test_prune_with_max_rate_0_is_unpaced():
    for _ in range(3):
        make(Status.SUCCEEDED, events=0)
    assert retention.prune(timezone.now(), batch=1, max_rate=0).jobs == 3


def test_the_last_short_batch_is_not_followed_by_a_wait():
    for _ in range(5):
        make(Status.SUCCEEDED, events=0)
    started = time.monotonic()
    prune("--older-than", "1h", "--batch", "10", "--max-rate", "1")
    assert time.monotonic() - started < 5  # 5 jobs at 1 job/s would wait 5 s
    assert not Job.objects.exists()


def test_oldest_finished_jobs_go_first():
    newer, older = make(Status.SUCCEEDED, timedelta(days=35)), make(Status.SUCCEEDED)
    done = retention.delete_batch(timezone.now() - timedelta(days=30),
                                  retention.DEFAULT_STATUSES, 1)  # fmt: skip
    assert (done.jobs, done.events, done.batches) == (1, 2, 1)
    assert list(Job.objects.values_list("pk", flat=True)) == [newer.pk]
    assert not JobEvent.objects.filter(job_id=older.pk).exists()


POSTGRESQL = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="PostgreSQL's one-statement batch and row locks"
)


@POSTGRESQL
def test_a_batch_is_one_statement_on_postgresql():
    for _ in range(3):
        make(Status.SUCCEEDED)
    with CaptureQueriesContext(connection) as queries:
        done = retention.delete_batch(timezone.now(), retention.DEFAULT_STATUSES, 10)
    assert (done.jobs, done.events) == (3, 6)
    statements = [q["sql"] for q in queries if q["sql"] not in ("BEGIN", "COMMIT")]
    assert len(statements) == 1, statements
    assert not Job.objects.exists() and not JobEvent.objects.exists()


@POSTGRESQL
def test_rows_locked_by_another_transaction_are_skipped_and_pruned_later():
    locked = make(Status.SUCCEEDED)
    make(Status.SUCCEEDED, timedelta(days=35))
    holding, release = threading.Event(), threading.Event()

    def hold_lock() -> None:
        try:
            with transaction.atomic():
                Job.objects.select_for_update().get(pk=locked.pk)
                holding.set()
                release.wait(10)
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold_lock)
    thread.start()
    try:
        assert holding.wait(10)
        started = time.monotonic()
        first = retention.prune(timezone.now() - timedelta(days=30))
        assert time.monotonic() - started < 5  # skipped, not waited for
    finally:
        release.set()
        thread.join(10)
    assert (first.jobs, first.events) == (1, 2)
    assert list(Job.objects.values_list("pk", flat=True)) == [locked.pk]
    assert JobEvent.objects.filter(job_id=locked.pk).count() == 2
    assert retention.prune(timezone.now() - timedelta(days=30)).jobs == 1
    assert not Job.objects.exists() and not JobEvent.objects.exists()


def test_dry_run_counts_and_deletes_nothing():
    make(Status.SUCCEEDED), make(Status.CANCELLED, events=0), make(Status.DEAD)
    out = prune("--older-than", "30d", "--dry-run")
    assert out.startswith("dry run: would delete 2 succeeded,cancelled,skipped jobs")
    assert "with 2 event(s)" in out
    assert Job.objects.count() == 3 and JobEvent.objects.count() == 4


def test_nothing_to_prune():
    make(Status.SUCCEEDED, timedelta(hours=1))
    assert "deleted 0 " in prune("--older-than", "2h")
    assert Job.objects.count() == 1


def test_database_down_is_a_command_error(tmp_path):
    down = "the jobs database 'default' is unavailable"
    with database_down(tmp_path), pytest.raises(CommandError, match=down):
        prune("--older-than", "1d")
    with database_down(tmp_path), pytest.raises(CommandError, match=down):
        call_command("delayjobs_reconcile")  # a traceback before


# -- the setting ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 59, -1, "30d", True, float("nan"), 10**12])
def test_prune_after_seconds_is_checked(value):
    with settings_with(PRUNE_AFTER_SECONDS=value):
        errors = check_settings()
    assert [e.id for e in errors if "PRUNE_AFTER_SECONDS" in e.msg] != []


def test_prune_after_seconds_accepts_none_and_a_day():
    for value in (None, 86400, 60):
        with settings_with(PRUNE_AFTER_SECONDS=value):
            assert check_settings() == []


# -- automatic pruning --------------------------------------------------------------------------


def test_auto_prune_is_off_by_default():
    make(Status.SUCCEEDED)
    assert AutoPrune(get_engine()).step() is None
    assert Job.objects.count() == 1


def test_one_pass_per_interval_across_processes():
    old = [make(Status.SUCCEEDED) for _ in range(3)]
    dead = make(Status.DEAD)
    with settings_with(PRUNE_AFTER_SECONDS=86400):
        first, second = (AutoPrune(get_engine(), batch=2, batches=1) for _ in range(2))
        assert first.step().jobs == 2
        assert second.step() is None  # the first one holds this interval's turn
        first.next_try = 0
        assert first.step().jobs == 1  # the same pass, next batch; then the pass is over
        make(Status.SUCCEEDED)
        first.next_try = second.next_try = 0
        assert first.step() is None and second.step() is None  # next pass not due yet
    assert not Job.objects.filter(pk__in=[j.pk for j in old]).exists()
    assert Job.objects.filter(pk=dead.pk).exists()


def test_auto_prune_does_a_few_paced_batches_per_step(monkeypatch):
    old = [make(Status.SUCCEEDED) for _ in range(7)]
    monkeypatch.setattr(retention, "DEFAULT_RATE", 2)  # 2 jobs: 1 s
    pruner = AutoPrune(get_engine(), batch=2, batches=3)
    with settings_with(PRUNE_AFTER_SECONDS=86400):
        started = time.monotonic()
        first = pruner.step()
        took = time.monotonic() - started
        assert (first.jobs, first.batches) == (6, 3)
        # Paced at the command's rate, and no wait after the last batch (which would make
        # it 3 s): 0.8 s of slack for the last batch's own work on a loaded machine.
        assert 2.0 <= took < 2.8, took
        assert pruner.cutoff is not None  # 6 = 2 * 3: the pass may not be over
        pruner.next_try = 0
        second = pruner.step()
        assert (second.jobs, second.batches) == (1, 1)
        assert pruner.cutoff is None  # fewer than 2 * 3: the pass is over
    assert not Job.objects.filter(pk__in=[j.pk for j in old]).exists()


def test_prune_stops_after_max_batches():
    for _ in range(5):
        make(Status.SUCCEEDED)
    done = retention.prune(timezone.now() - timedelta(days=1), batch=2, max_batches=2)
    assert (done.jobs, done.batches) == (4, 2)
    assert Job.objects.count() == 1
    for wrong in (0, -1, True, 2.5, "3"):
        with pytest.raises(ValueError, match="max_batches"):
            retention.prune(timezone.now(), max_batches=wrong)
    assert Job.objects.count() == 1


def test_auto_prune_survives_redis_down_and_logs_once(caplog):
    make(Status.SUCCEEDED)
    server = EmbeddedRedis()
    server.start()
    import redis

    engine = Engine(redis.Redis.from_url(server.url), prefix="gone")
    server.close()
    pruner = AutoPrune(engine)
    with settings_with(PRUNE_AFTER_SECONDS=86400), caplog.at_level(logging.WARNING):
        assert pruner.step() is None
        pruner.next_try = 0
        assert pruner.step() is None
    engine.close()
    failures = [r for r in caplog.records if "automatic pruning failed" in r.getMessage()]
    assert len(failures) == 1
    assert Job.objects.count() == 1


def test_auto_prune_retries_after_the_database_comes_back(tmp_path, caplog):
    old = make(Status.SUCCEEDED)
    pruner = AutoPrune(get_engine())
    with settings_with(PRUNE_AFTER_SECONDS=86400), caplog.at_level(logging.WARNING):
        with database_down(tmp_path):
            assert pruner.step() is None  # took this interval's turn, then failed
            pruner.next_try = 0
            assert pruner.step() is None
        assert pruner.step() is None  # waits AUTO_RETRY_SECONDS
        assert Job.objects.filter(pk=old.pk).exists()
        pruner.next_try = 0
        assert pruner.step().jobs == 1  # the same pass goes on
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "automatic pruning failed" in m]) == 1
    assert "automatic pruning works again" in messages
    assert not Job.objects.filter(pk=old.pk).exists()


@pytest.mark.slow
def test_a_worker_prunes_when_the_setting_is_on(redis_url, tmp_path):
    old, recent, dead = make(Status.SUCCEEDED), make(Status.SUCCEEDED, timedelta(0)), \
        make(Status.DEAD)  # fmt: skip
    worker = start_worker(redis_url, env={"DELAYJOBS_PRUNE_AFTER_SECONDS": "86400"},
                          log=tmp_path / "w.log")  # fmt: skip
    try:
        wait_for(lambda: not Job.objects.filter(pk=old.pk).exists())
    finally:
        assert stop(worker) == 0
    assert set(Job.objects.values_list("pk", flat=True)) == {recent.pk, dead.pk}
