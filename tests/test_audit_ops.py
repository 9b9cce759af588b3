"""Audit of the operations side: reproductions that fail today."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

pytestmark = pytest.mark.django_db(transaction=True)

COMMANDS = [
    ("delayjobs_health",),
    ("delayjobs_stats",),
    ("delayjobs_reconcile",),
    ("run_delayworker", "--burst", "-v", "0"),
]


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: argv[0])
def test_a_cache_alias_that_is_not_django_redis_is_a_one_line_error(settings, argv):
    """``CACHE_ALIAS`` naming a cache that is not django-redis's (or a cache that does not
    match ``REDIS_CLUSTER``) passes ``manage.py check``, then connection.py raised Django's
    ImproperlyConfigured, which no command catches (they catch DelayJobsError): every
    command ended in a traceback, and the ``health/`` view in a 500."""
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    settings.DELAYJOBS = {**settings.DELAYJOBS, "CACHE_ALIAS": "default"}
    with pytest.raises(CommandError, match="is not a django-redis cache"):
        call_command(*argv)


def test_the_health_view_says_settings_fail_for_a_cache_alias_that_is_not_django_redis(
    settings, client
):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    settings.DELAYJOBS = {**settings.DELAYJOBS, "CACHE_ALIAS": "default"}
    client.raise_request_exception = False
    response = client.get("/delayjobs/health/")
    assert response.status_code == 503
    assert response.json() == {"status": "fail", "checks": {"settings": "fail"}}


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
