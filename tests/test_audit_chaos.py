"""Audit (chaos): failing tests for the worker under hostile actions."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from django_delayjobs import schedule
from django_delayjobs.models import Status
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_action_that_marks_its_transaction_for_rollback_fails_with_a_clear_error():
    """``transaction.set_rollback(True)`` (or an error caught inside an atomic block without
    a savepoint): its writes roll back, so the attempt failed, and the history says why
    instead of quoting Django's refusal of the worker's own outcome statement."""
    job = schedule(tasks.record_then_set_rollback, in_=0, args=["rolled back"], max_attempts=2)
    after = schedule(tasks.record, in_=0, args=["after"])
    call_command("run_delayworker", "--burst", "-v", "0")
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.RETRYING, 1)
    assert job.last_error.startswith(
        "django.db.transaction.TransactionManagementError: the action returned with its "
        "transaction marked for rollback"
    ), job.last_error
    assert list(Record.objects.values_list("label", flat=True)) == ["after"]
    after.refresh_from_db()
    assert after.status == Status.SUCCEEDED
