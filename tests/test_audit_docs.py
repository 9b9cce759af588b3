"""Audit: a REDIS_URL redis-py cannot use passed the checks and crashed run_delayworker."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_delayjobs.checks import check_settings


@pytest.mark.parametrize("url", ["foo://localhost:6379/0", "localhost:6379", "redis://h/x"])
def test_a_redis_url_redis_py_cannot_use_is_a_check_error(settings, url):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": url}
    assert [e.id for e in check_settings()] == ["django_delayjobs.E006"]


@pytest.mark.django_db(transaction=True)
def test_run_delayworker_refuses_such_a_redis_url_with_one_line(settings):
    """settings.md and worker.md: an invalid setting makes run_delayworker refuse to start
    with one line; redis-py's ValueError ended it in a traceback."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": "foo://localhost:6379/0"}
    with pytest.raises(CommandError, match="REDIS_URL"):
        call_command("run_delayworker", "--burst", "-v", "0")
