"""Audit: a CACHE_ALIAS that is not in CACHES (check E007) at run time."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from .test_settings_checks import COMMANDS


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: argv[0])
def test_a_cache_alias_not_in_caches_is_a_one_line_error(settings, argv):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "CACHE_ALIAS": "nope"}
    with pytest.raises(CommandError, match="nope"):
        call_command(*argv)


@pytest.mark.django_db(transaction=True)
def test_health_view_says_settings_fail_for_a_cache_alias_not_in_caches(settings, client):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "CACHE_ALIAS": "nope"}
    client.raise_request_exception = False
    response = client.get("/delayjobs/health/")
    assert response.status_code == 503
    assert response.json() == {"status": "fail", "checks": {"settings": "fail"}}
