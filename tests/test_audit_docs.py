"""Audit: failing tests for entry points that a bad DELAYJOBS dict made fail with a traceback."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError

from .test_settings_checks import COMMANDS

BAD = {"MAX_ATTEMPTS": 0}  # out of range: a web process runs no system checks


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: argv[0])
def test_bad_settings_are_a_one_line_error_of_every_command(settings, argv):
    """delayjobs_health read DEFAULT_QUEUE before it caught bad settings: a traceback."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, **BAD}
    with pytest.raises(CommandError, match="MAX_ATTEMPTS"):
        call_command(*argv)


@pytest.mark.django_db(transaction=True)
def test_health_and_metrics_views_say_settings_fail_for_invalid_settings(settings, client):
    """Both read a setting (DEFAULT_QUEUE, METRICS_TOKEN) before they caught bad settings:
    a 500 and a traceback per probe or scrape, where a CACHE_ALIAS gone wrong gave 503."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, **BAD}
    client.raise_request_exception = False
    response = client.get("/delayjobs/health/")
    assert response.status_code == 503
    assert response.json() == {"status": "fail", "checks": {"settings": "fail"}}
    admin = User.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(admin)
    response = client.get("/delayjobs/metrics/")
    assert response.status_code == 503
    assert b"settings cannot work" in response.content
