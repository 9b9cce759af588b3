"""Audit of the admin and the API under hostile requests and least privilege, second
round: each test fails on the code it was written against (its docstring says what is
wrong)."""

from __future__ import annotations

import ipaddress

import pytest
from django.core.cache import cache

from django_delayjobs import services
from django_delayjobs.callbacks import policy
from django_delayjobs.callbacks.signing import new_secret
from django_delayjobs.models import Job

from .test_rest_helpers import client_for, make_user, url

pytestmark = pytest.mark.django_db(transaction=True)

HOOK = "https://hooks.example.com/orders/42/expire"


@pytest.fixture(autouse=True)
def http(settings, redis_client):
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": ["hooks.example.com"],
        "HTTP_SIGNING_SECRETS": [new_secret()],
    }
    cache.clear()  # throttle history
    with policy.use_resolver(lambda host, port: [ipaddress.ip_address("93.184.215.14")]):
        yield settings


@pytest.mark.parametrize(("verb", "body"), [("cancel", {}), ("reschedule", {"in": 5})])
def test_a_callback_purged_while_the_verb_lost_is_404(monkeypatch, verb, body):
    """callbacks/cancel/ and callbacks/reschedule/ read the status of a callback they were
    too late for: one purged meanwhile (dead, then purged from the admin) raised
    Job.DoesNotExist there, a 500. jobs/<id>/cancel/ answers 404 then, and so do they."""
    admin = client_for(make_user(superuser=True))
    job_id = admin.post(url("callbacks"), {"url": HOOK, "in": 60}, format="json").json()["id"]

    def lost_then_purged(job: Job, **kwargs: object) -> bool:
        Job.objects.filter(pk=job.pk).delete()  # a purge between the verb and the answer
        return False

    monkeypatch.setattr(services, verb, lost_then_purged)
    response = admin.post(url("callbacks", verb), {"id": job_id, **body}, format="json")
    assert response.status_code == 404
    assert "detail" in response.json()
