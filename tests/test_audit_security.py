"""Security audit: each test reproduces one problem and fails on the current code.

They pass once the problem is fixed; the docstring of each says what is wrong, what it
costs, and what the right behaviour is.
"""

from __future__ import annotations

import ipaddress

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "hunter2-s3cret-pw"


@pytest.fixture(autouse=True)
def _clean_redis(redis_client):
    """Every test starts from an empty Redis database."""


def burst() -> None:
    call_command("run_delayworker", "--burst", "-v", "0")


def test_add_job_alone_does_not_read_another_callers_callback(settings):
    """rest/callbacks.py CallbackCreateView.post answers a ``key`` that an active callback
    already holds with ``s.JobSerializer(job).data`` of that job (and CallbackCancelView /
    CallbackRescheduleView answer with ``JobDetailSerializer``, events included), to any
    user holding API_CALLBACK_PERMISSIONS (``add_job``): no ``view_job`` is asked for.

    Impact: a service account (the documented set-up: ``IsAuthenticated`` + ``add_job``)
    reads another service's callbacks, found by guessable keys such as ``order-42``:
    their URL, headers, JSON body (tokens, personal data), result and last error (the
    receiver's kept response body). docs/api.md promises "the API shows no job to a user
    the admin would not show it to, whatever API_PERMISSION_CLASSES says"; the admin
    shows nothing to a user with ``add_job`` only.

    Right: without ``view_job`` (or ``change_job``), the 200 for an existing key (and the
    cancel/reschedule answers) carry only what idempotency needs (id, status, key,
    run_at), not the stored request, result, error or history.
    """
    from django.core.cache import cache

    from django_delayjobs.callbacks import policy

    from .test_rest_helpers import client_for, make_user, url

    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "API_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
        "HTTP_ALLOWED_HOSTS": ["hooks.example.com"],
    }
    cache.clear()
    payments = client_for(make_user("payments", staff=False, perms=("add_job",)))
    marketing = client_for(make_user("marketing", staff=False, perms=("add_job",)))
    public = [ipaddress.ip_address("93.184.215.14")]
    with policy.use_resolver(lambda host, port: public):
        first = payments.post(
            url("callbacks"),
            {"url": "https://hooks.example.com/pay", "in": 600, "key": "order-42",
             "json": {"card_token": "tok_live_PRIVATE"}},
            format="json",
        )  # fmt: skip
        assert first.status_code == 201, first.content
        probe = marketing.post(
            url("callbacks"),
            {"url": "https://hooks.example.com/x", "in": 600, "key": "order-42"},
            format="json",
        )
    assert probe.status_code in (200, 409)
    assert "tok_live_PRIVATE" not in probe.content.decode()
    assert "hooks.example.com/pay" not in probe.content.decode()
