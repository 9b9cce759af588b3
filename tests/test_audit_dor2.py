"""Audit of the door, round 3: requeue's key conflict, the purge fence, ``cancel_for``'s
target. One test per finding; each says what used to happen."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import IntegrityError, connection, connections

from django_delayjobs import cancel_for, schedule, services
from django_delayjobs.exceptions import InvalidSchedule
from django_delayjobs.models import Job, Status
from tests.testapp import tasks
from tests.testapp.models import LoudThing, Sku, Thing

from .test_rest_helpers import burst, client_for, make_user, url

pytestmark = pytest.mark.django_db(transaction=True)

postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="SQLite's write lock: no other connection deletes a row while requeue's "
    "transaction is open",
)


def _purge_in_another_connection(job: Job) -> None:
    def run() -> None:
        try:
            assert services.purge(job)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()


def _purged_after_the_conflict(job: Job) -> Any:
    """An execute wrapper: once requeue's UPDATE has hit the key's constraint, a purge in
    another connection deletes the job and commits before requeue's next query."""
    table = Job._meta.db_table
    conflict: list[bool] = []

    def wrapper(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        if conflict == [True] and sql.lstrip().upper().startswith("SELECT") and table in sql:
            conflict.append(True)
            _purge_in_another_connection(job)
        try:
            return execute(sql, params, many, context)
        except IntegrityError:
            if sql.lstrip().upper().startswith("UPDATE") and table in sql:
                conflict.append(True)
            raise

    return wrapper, conflict


def _dead_keyed_job_and_its_key_held() -> Job:
    job = schedule(tasks.fail, in_=0, key="k", max_attempts=1)
    burst()
    job.refresh_from_db()
    assert job.status == Status.DEAD
    schedule(tasks.record, in_=3600, args=["x"], key="k")  # holds the key now
    return job


@postgresql_only
@pytest.mark.parametrize("via", ["service", "rest"])
def test_a_requeue_whose_job_is_purged_after_its_key_conflict_is_not_a_crash(via):
    """Requeue read the row again after its key's constraint refused it, with ``.get()``:
    a purge committing in between raised ``Job.DoesNotExist``, which neither the admin's
    action nor the REST view catches (a 500). The job is gone: not requeued (the REST
    view says 404, as for a job purged before the call)."""
    job = _dead_keyed_job_and_its_key_held()
    wrapper, conflict = _purged_after_the_conflict(job)
    with connection.execute_wrapper(wrapper):
        if via == "service":
            assert services.requeue(job) is False
        else:
            client = client_for(make_user(superuser=True))
            response = client.post(url("jobs", job.pk, "requeue"), {}, format="json")
            assert response.status_code == 404, response.content  # purged meanwhile
    assert conflict == [True, True]  # the window was there, and the purge in it
    assert not Job.objects.filter(pk=job.pk).exists()


def _active(job: Job) -> bool:
    return Job.objects.get(pk=job.pk).status == Status.SCHEDULED


@pytest.mark.parametrize("through", ["child", "parent"])
@pytest.mark.parametrize("with_action", [False, True], ids=["any", "action"])
def test_cancel_for_finds_a_rows_jobs_scheduled_through_its_multi_table_child_or_parent(
    through, with_action
):
    """A job scheduled on a multi-table child (``schedule(loud.touch)``) names the child's
    content type: ``cancel_for(thing)``, the same row read as its parent, looked up Thing
    and its proxies only and cancelled nothing (and ``cancel_for(loud)`` missed a job
    scheduled on the parent), so a payment's cancel left the job to run."""
    loud = LoudThing.objects.create(name="loud")
    thing = Thing.objects.get(pk=loud.pk)
    other = Thing.objects.create(name="other")
    job = schedule((loud if through == "child" else thing).touch, in_=3600)
    kept = schedule(other.touch, in_=3600)
    target = thing if through == "child" else loud
    action = (Thing.touch,) if with_action else ()
    assert cancel_for(target, *action) == 1
    assert not _active(job)
    assert _active(kept)


def test_cancel_for_a_parent_row_takes_a_method_of_its_multi_table_child():
    """``cancel_for(thing, LoudThing.shout)`` raised TypeError (a method of LoudThing, and
    a Thing is not one) though the thing's row is a LoudThing with a job of that method.
    A method of an unrelated model is still refused."""
    loud = LoudThing.objects.create(name="loud")
    job = schedule(loud.shout, in_=3600)
    thing = Thing.objects.get(pk=loud.pk)
    with pytest.raises(TypeError, match="is a method of Sku"):
        cancel_for(thing, Sku.touch)
    assert cancel_for(thing, LoudThing.shout) == 1
    assert not _active(job)


@pytest.mark.parametrize("pk", [True, 1.5], ids=["bool", "float"])
def test_cancel_for_an_instance_whose_pk_is_a_bool_or_a_fraction_cancels_no_other_row(pk):
    """``cancel_for(Thing(pk=True))`` (or ``pk=1.5``) read the key through the field as
    ``int(pk)``, and cancelled the jobs of row 1: a caller's bug cancelled another
    object's jobs, and ``schedule`` on such an instance targeted row 1. No job targets
    such a key."""
    one = Thing.objects.create(pk=1, name="one")
    job = schedule(one.touch, in_=3600)
    assert cancel_for(Thing(pk=pk)) == 0
    assert _active(job)
    one.pk = pk
    with pytest.raises(InvalidSchedule, match="not a key of this model"):
        schedule(one.touch, in_=3600)
    assert Job.objects.count() == 1
    assert cancel_for(Thing(pk=1)) == 1  # the row's own key still finds it
