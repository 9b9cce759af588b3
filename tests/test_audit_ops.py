"""Audit of the operations side: reproductions that fail today."""

from __future__ import annotations

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
