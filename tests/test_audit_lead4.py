"""Lead's audit, 2026-11-30 (second session): what the reviews found and left to me."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

from django_delayjobs.connection import get_engine
from django_delayjobs.models import Job
from django_delayjobs.retention import AutoPrune
from tests.helpers import wait_for
from tests.test_audit_ret import auto_prune_settings, hand_table, old_jobs

pytestmark = pytest.mark.django_db(transaction=True)

__all__ = ["hand_table"]  # a fixture, used by name


def test_the_automatic_prune_tries_refused_jobs_again_once_a_while(hand_table):
    """A job the database refused to delete (a table with no model refers to it) is
    skipped by the process's later passes, so that it is not tried in every one. Its
    refusal was kept for the life of the process: once the row that referred to it was
    gone, the job outlived PRUNE_AFTER_SECONDS until the worker restarted."""
    refused = old_jobs(3, timedelta(days=50))
    hand_table(refused)
    with auto_prune_settings():
        pruner = AutoPrune(get_engine(), every=0.05, batch=10, batches=100)
        first = pruner.step()
        assert first is not None and first.protected == 3 and first.complete, first
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM audit_ret_note")  # nothing refers to them now
        # Passes within the interval still skip them (not tried again each time) ...
        wait_for(lambda: pruner.step() is not None, timeout=5)
        assert Job.objects.count() == 3
        # ... and the first pass after it tries them again.
        pruner.refused_kept_for = 0.0
        wait_for(lambda: pruner.step() is not None, timeout=5)
        assert Job.objects.count() == 0
