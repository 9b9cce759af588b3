"""Audit of the admin and the API under hostile requests and least privilege, fourth
round: each test fails on the code it was written against (its docstring says what is
wrong)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_delayjobs import schedule
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _clean_redis(redis_client):
    """Every test starts from an empty Redis database."""


def test_the_purge_confirmation_of_every_job_reads_only_the_jobs_it_lists(admin_client):
    """Asking to purge every job of the list (select_across) read the selection with an
    unbounded iterator to list its first 100: on PostgreSQL a server-side cursor WITH HOLD
    copies every selected row (a million) before the first is read. It reads 101 now."""
    job = schedule(tasks.record, in_=3600, args=["x"])
    data = {"action": "purge_dead", "_selected_action": [str(job.pk)], "select_across": "1",
            "index": "0"}  # fmt: skip
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.post(reverse("admin:django_delayjobs_job_changelist"), data)
    assert response.status_code == 200 and b"None of the selected jobs is dead" in response.content
    column = '"django_delayjobs_job"."kwargs"'  # a read of whole job rows
    reads = [q["sql"] for q in queries.captured_queries if column in q["sql"]]
    assert reads and all("LIMIT 101" in sql for sql in reads), reads
