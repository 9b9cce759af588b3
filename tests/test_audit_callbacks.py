"""Audit of HTTP callbacks: failing tests first, moved to their modules once fixed."""

from __future__ import annotations

import pytest

from django_delayjobs import schedule_http
from django_delayjobs.models import JobEvent
from tests.test_callbacks_admin import client, detail, http  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_attempt_whose_history_line_is_blank_renders(client, http):  # noqa: F811
    """A row written by anything (an older version, a manual edit): a blank message."""
    job = schedule_http(http.url(), in_=60)
    JobEvent.objects.create(job=job, kind="failed", actor="worker:w", message=" \n")
    assert "HTTP callback" in detail(client, job)
