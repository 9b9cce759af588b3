"""Audit of the operations side: reproductions that fail today."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.django_db(transaction=True)


def test_pruning_dead_jobs_with_redis_settings_that_cannot_work_warns_once(settings, caplog):
    """The rows are deleted before their ids are purged from Redis's garbage, and the
    prune goes on when Redis is down; but settings that give no Redis client raised out of
    ``GarbagePurge`` (which caught only ``EngineUnavailable``): a traceback after the first
    batch, the rest of the prune not done."""
    import logging
    from datetime import timedelta

    from django.utils import timezone

    from django_delayjobs.models import Job, Status

    now = timezone.now()
    for _ in range(3):
        Job.objects.create(queue="orders", action="tests.nothing", status=Status.DEAD,
                           run_at=now - timedelta(days=100),
                           finished_at=now - timedelta(days=40))  # fmt: skip
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    settings.DELAYJOBS = {**settings.DELAYJOBS, "CACHE_ALIAS": "default"}
    with caplog.at_level(logging.WARNING, logger="django_delayjobs.retention"):
        call_command("delayjobs_prune", "--older-than", "30d", "--status", "dead",
                     "--batch", "1", stdout=StringIO())  # fmt: skip
    assert not Job.objects.exists()
    warnings = [r.getMessage() for r in caplog.records if r.name == "django_delayjobs.retention"]
    assert len(warnings) == 1 and "left 3 deleted dead job id(s)" in warnings[0]
