"""The PostgreSQL pass with server-side binding (.ci/run's step 7) prepares the statements
django-delayjobs runs for every job: docs/operations.md recommends it for workers, and
that pass is what shows that every query of the package runs under it."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_delayjobs import schedule, sql
from django_delayjobs.models import Job, Status
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_server_side_binding_pass_prepares_the_schedule_and_claim_statements():
    options = connection.settings_dict["OPTIONS"]
    if (
        connection.vendor != "postgresql"
        or options.get("server_side_binding") is not True
        or options.get("prepare_threshold") is None  # Django's default: nothing prepared
    ):
        pytest.skip("PostgreSQL with prepared statements only (DELAYJOBS_TEST_DATABASE_OPTIONS)")
    jobs = [schedule(tasks.record, in_=0, args=[str(n)]) for n in range(7)]
    now = timezone.now()
    for job in jobs:  # in this thread: a session's prepared statements are its own
        with transaction.atomic():
            claimed = sql.claim(str(job.pk), "lead18", now, 3)
        assert claimed is not None and claimed.status == Status.RUNNING
        assert claimed.attempts == 1
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [statement for (statement,) in cursor.fetchall()]
    table = connection.ops.quote_name(Job._meta.db_table)
    # psycopg prepares an executemany's statement at once (the INSERT), any other once it
    # ran prepare_threshold times (the claim's UPDATE, run seven times here).
    assert any(s.startswith(f"INSERT INTO {table}") for s in prepared), prepared
    assert any(s.startswith(f"UPDATE {table}") and "attempts" in s for s in prepared), prepared
