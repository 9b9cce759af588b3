"""Audit of HTTP callbacks: failing tests first, moved to their modules once fixed."""

from __future__ import annotations

import time

import pytest
from django.utils import timezone

from django_delayjobs import schedule_http
from django_delayjobs.models import Status
from tests.callback_server import Reply
from tests.test_callbacks_e2e import burst, http  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    "form",
    [
        "%a %b %e %H:%M:%S %Y",  # asctime: "Sun Nov  6 08:49:37 1994" (RFC 9110 5.6.7)
        "%a, %d %b %Y %H:%M:%S -0000",  # RFC 5322's "-0000": UTC
    ],
)
def test_retry_after_in_every_http_date_format_is_honoured(callback_server, form):
    value = time.strftime(form, time.gmtime(time.time() + 30))
    callback_server.script("/hook", Reply(503, b"", {"Retry-After": value}))
    job = schedule_http(callback_server.url(), in_=0)
    before = timezone.now()
    burst()
    job.refresh_from_db()
    assert job.status == Status.RETRYING
    assert 27 < (job.run_at - before).total_seconds() < 32, job.last_error
