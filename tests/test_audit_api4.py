"""Audit of the REST API, fourth round: the callback endpoints and object permissions
(callbacks/ answered for another team's job that jobs/<id>/ refuses)."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.permissions import BasePermission

from django_delayjobs.models import Job, Status

from . import test_rest_helpers
from .test_rest_helpers import client_for, make_user, url

http = test_rest_helpers.http  # a fixture: callbacks to hooks.example.com allowed

pytestmark = pytest.mark.django_db(transaction=True)

HOOK = "https://hooks.example.com/orders/42/expire"


# -- 1. the callback endpoints check object permissions, as jobs/<id>/ does ---------------


class OwnQueueOnly(BasePermission):
    """A team acts on the jobs of its own queue only (the queue named as its user)."""

    message = "Not your team's queue."

    def has_object_permission(self, request: Any, view: Any, obj: Any) -> bool:
        return bool(obj.queue == request.user.username)


@pytest.fixture
def teams(http):
    http.DELAYJOBS = {
        **http.DELAYJOBS,
        "API_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated", OwnQueueOnly],
    }
    perms = ("add_job", "change_job")
    orders = client_for(make_user("orders", staff=False, perms=perms))
    mail = client_for(make_user("mail", staff=False, perms=perms))
    created = orders.post(
        url("callbacks"), {"url": HOOK, "in": 600, "key": "k", "queue": "orders"}, format="json"
    )
    assert created.status_code == 201, created.content[:300]
    return orders, mail, Job.objects.get(pk=created.json()["id"])


def _lookups(job: Job) -> list[dict[str, Any]]:
    return [{"key": "k", "queue": "orders"}, {"id": str(job.pk)}]


def test_callbacks_cancel_checks_object_permissions(teams):
    """callbacks/cancel/ cancelled another team's callback (200) that jobs/<id>/cancel/
    refuses (403): it found the job and acted without asking the object permissions."""
    orders, mail, job = teams
    assert mail.post(url("jobs", job.pk, "cancel"), {}, format="json").status_code == 403
    for lookup in _lookups(job):
        refused = mail.post(url("callbacks", "cancel"), lookup, format="json")
        assert refused.status_code == 403, (lookup, refused.content[:300])
        assert refused.json() == {"detail": "Not your team's queue."}
    assert Job.objects.get(pk=job.pk).status == Status.SCHEDULED
    allowed = orders.post(url("callbacks", "cancel"), {"key": "k", "queue": "orders"},
                          format="json")  # fmt: skip
    assert allowed.status_code == 200, allowed.content[:300]
    assert Job.objects.get(pk=job.pk).status == Status.CANCELLED


def test_callbacks_reschedule_checks_object_permissions(teams):
    orders, mail, job = teams
    before = Job.objects.get(pk=job.pk).run_at
    for lookup in _lookups(job):
        refused = mail.post(url("callbacks", "reschedule"), {**lookup, "in": 5}, format="json")
        assert refused.status_code == 403, (lookup, refused.content[:300])
    assert Job.objects.get(pk=job.pk).run_at == before
    allowed = orders.post(url("callbacks", "reschedule"), {"id": str(job.pk), "in": 5},
                          format="json")  # fmt: skip
    assert allowed.status_code == 200, allowed.content[:300]
    assert Job.objects.get(pk=job.pk).run_at < before


def test_callbacks_create_with_a_held_key_checks_object_permissions(teams):
    """callbacks/ with the key of an active callback answers with that job: only to a
    user who may act on it."""
    orders, mail, job = teams
    body = {"url": HOOK, "in": 60, "key": "k", "queue": "orders"}
    refused = mail.post(url("callbacks"), body, format="json")
    assert refused.status_code == 403, refused.content[:300]
    assert str(job.pk) not in refused.content.decode()
    again = orders.post(url("callbacks"), body, format="json")
    assert (again.status_code, again.json()["id"]) == (200, str(job.pk))
    assert Job.objects.filter(queue="orders", key="k").count() == 1
