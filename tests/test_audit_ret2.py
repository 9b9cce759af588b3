"""Audit of retention, second round: the cost of a prune's batches beside jobs it keeps,
the database's own ``on_delete``, the jobs on a database of their own."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.apps import apps
from django.db import connection, connections, models
from django.utils import timezone

from django_delayjobs import retention
from django_delayjobs.connection import get_engine
from django_delayjobs.models import Job, JobEvent, Status
from tests.test_audit_ret import clone_rows, copies, old_jobs
from tests.test_retention import dead_in_garbage
from tests.testapp.models import Receipt

pytestmark = pytest.mark.django_db(transaction=True)


def test_batches_do_not_read_again_the_jobs_a_model_keeps():
    """Every batch's query started at the oldest finished job: one that a model refers to
    is left, so with many of them each batch read them all again (0.4 s a batch, holding
    SQLite's write lock, beside 200,000 of them; a prune's time grew with their number
    times its batches). A pass now walks on from where its last batch stopped."""
    [kept] = old_jobs(1, timedelta(days=50))
    copies(kept, 40_000 - 1)
    old_jobs(200, timedelta(days=40))
    cutoff = timezone.now() - timedelta(days=30)
    times: list[float] = []
    started = time.monotonic()
    done = retention.prune(cutoff, batch=10, progress=lambda _: times.append(time.monotonic()))
    assert (done.jobs, done.batches, done.protected) == (200, 20, 40_000), done
    first, rest = times[0] - started, times[-1] - times[0]
    # The first batch reads past the 40,000 kept jobs; the 19 others no more.
    assert rest < 5 * first, (first, rest)
    assert Job.objects.count() == Receipt.objects.count() == 40_000


def recent_jobs(n: int) -> None:
    """``n`` jobs finished a moment ago, as a deployment keeps (made by the database)."""
    [job] = old_jobs(1, timedelta(0))
    clone_rows(job, n - 1)


def timed_prune(n: int) -> float:
    old_jobs(n, timedelta(days=40))
    started = time.monotonic()
    done = retention.prune(timezone.now() - timedelta(days=30), batch=10)
    assert done.jobs == n, done
    return time.monotonic() - started


def test_a_batch_deletes_its_jobs_without_reading_every_finished_one():
    """SQLite read a batch's delete, ``status IN (...) AND finished_at < ? AND id IN
    (...)``, through the (status, run_at) index: every job of those statuses, the 30 days
    a deployment keeps as well, twice a batch (its events', its jobs'), holding the write
    lock. Pruning a day's jobs took as long as the kept ones times the batches."""
    alone = timed_prune(200)
    recent_jobs(60_000)
    beside = timed_prune(200)
    assert beside < 3 * alone + 0.1, (alone, beside)
    assert Job.objects.count() == 60_000


@pytest.mark.skipif(connection.vendor != "sqlite", reason="a finish time that is not one")
def test_a_finish_time_that_cannot_be_read_does_not_stop_the_walk():
    """A batch reads its jobs' finish times to know where the next one starts: a row
    written by hand whose time is not one is deleted all the same, and the walk goes on."""
    jobs = old_jobs(25, timedelta(days=40))
    with connection.cursor() as cursor:
        for job, text in ((jobs[9], "2020-99-99 00:00:00"), (jobs[19], "2020-01-01 junk")):
            cursor.execute(
                f"UPDATE {Job._meta.db_table} SET finished_at = %s WHERE id = %s",
                [text, job.pk.hex],
            )
    done = retention.prune(timezone.now() - timedelta(days=30), batch=10)
    assert (done.jobs, done.complete) == (25, True), done
    assert not Job.objects.exists()


@pytest.fixture
def note_model() -> Iterator[type[models.Model]]:
    """A model of the user's whose foreign key to ``Job`` the database acts on itself
    (Django 6's ``DB_CASCADE``, ``DB_SET_NULL``), with its table; gone afterwards."""
    made = []

    def make(on_delete: object) -> type[models.Model]:
        name = f"Note{len(made)}"
        attrs = {
            "__module__": __name__,
            "job": models.ForeignKey(Job, on_delete=on_delete, null=True, related_name="+"),
            "Meta": type("Meta", (), {"app_label": "testapp"}),
        }
        model = type(name, (models.Model,), attrs)
        with connection.schema_editor() as editor:
            editor.create_model(model)
        made.append(model)
        return model

    yield make
    for model in made:
        with connection.schema_editor() as editor:
            editor.delete_model(model)
        del apps.all_models["testapp"][model._meta.model_name]
    apps.clear_cache()


@pytest.mark.skipif(not hasattr(models, "DB_CASCADE"), reason="Django 6's database on_delete")
@pytest.mark.parametrize("action", ["DB_CASCADE", "DB_SET_NULL"])
def test_a_foreign_key_the_database_acts_on_does_not_keep_its_jobs(note_model, action):
    """The database deletes (or clears) the rows that refer to a pruned job itself: those
    jobs are pruned with the rest, not left as if the key refused their delete."""
    model = note_model(getattr(models, action))
    jobs = old_jobs(3, timedelta(days=40))
    for job in jobs:
        model._default_manager.create(job=job)
    assert model._meta.get_field("job") not in retention.references("default")
    done = retention.prune(timezone.now() - timedelta(days=30))
    assert (done.jobs, done.protected) == (3, 0), done
    assert not Job.objects.exists()
    left = list(model._default_manager.values_list("job_id", flat=True))
    assert left == ([] if action == "DB_CASCADE" else [None] * 3)


@pytest.mark.skipif(connection.vendor != "sqlite", reason="the batch chosen before its lock")
def test_a_dead_job_requeued_after_the_batch_chose_it_is_left_with_its_history():
    """On SQLite a batch's jobs are chosen before its transaction: one requeued in
    between is scheduled again, and the batch must neither delete it (nor its events)
    nor purge its id from Redis, where the requeue has put it back to run."""
    [job] = dead_in_garbage("orders")
    events = JobEvent.objects.filter(job=job).count()
    requeued = []

    def requeue_first(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        if sql.startswith("BEGIN") and not requeued:
            thread = threading.Thread(target=lambda: (requeued.append(job.requeue()),
                                                      connections.close_all()))  # fmt: skip
            thread.start()
            thread.join(10)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(requeue_first):
        done = retention.prune(timezone.now() - timedelta(days=30), [Status.DEAD])
    assert requeued == [True]
    assert done.jobs == 0, done
    job.refresh_from_db()
    assert job.status == Status.SCHEDULED
    assert JobEvent.objects.filter(job=job).count() == events + 1  # and "requeued"
    stats = get_engine().stats("orders")
    assert (stats.garbage, stats.pending + stats.ready) == (0, 1), stats
