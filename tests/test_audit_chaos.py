"""Audit (chaos): failing tests for the worker under hostile actions."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from django_delayjobs import schedule
from django_delayjobs.models import Job, Status
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def rename_column(old: str, new: str) -> None:
    table = connection.ops.quote_name(Job._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} RENAME COLUMN {old} TO {new}")


@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="SQLite reads a quoted column name it does not know as a string: its claim works",
)
def test_a_schema_behind_the_code_hands_the_job_back_instead_of_burying_it():
    """A worker of a new version started before ``migrate`` (a column its statements name
    is not there yet): the database refuses the claim, whatever the row holds. That is
    no poison row: the job is handed back, costs no attempt, and runs once migrated."""
    job = schedule(tasks.record, in_=0, args=["migrated"])
    rename_column("result", "result_later")  # as if a migration had not added it yet
    try:
        with pytest.raises(CommandError, match="handed back 1 job"):
            call_command("run_delayworker", "--burst", "-v", "0")
    finally:
        rename_column("result_later", "result")
    job.refresh_from_db()
    assert (job.status, job.attempts, job.last_error) == (Status.SCHEDULED, 0, "")
    call_command("run_delayworker", "--burst", "-v", "0")
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.SUCCEEDED, 1)
