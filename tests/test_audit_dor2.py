"""Audit of the door, round 3: requeue's key conflict, the purge fence, ``cancel_for``'s
target. One test per finding; each says what used to happen."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import IntegrityError, connection, connections

from django_delayjobs import schedule, services
from django_delayjobs.models import Job, Status
from tests.testapp import tasks

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
