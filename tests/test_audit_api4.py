"""Audit of the REST API, fourth round: the callback endpoints and object permissions
(callbacks/ answered for another team's job that jobs/<id>/ refuses), and a requeue whose
key's holder finishes between the refused UPDATE and the lookup of the holder (a 500);
an admin action stopped by a database error, which lost what it had done."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import OperationalError, connection, transaction
from django.test import RequestFactory
from django.urls import reverse
from rest_framework.permissions import BasePermission

from django_delayjobs import schedule, services
from django_delayjobs.admin import operations
from django_delayjobs.models import ACTIVE, Job, Status
from django_delayjobs.services import build_job
from tests.testapp import tasks

from . import test_rest_helpers
from .test_rest_helpers import client_for, dead_job, make_user, url

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


# -- 3. a requeue refused by the key's constraint whose holder finished meanwhile ---------


def _dead_and_held() -> tuple[Job, Job]:
    job = dead_job()
    Job.objects.filter(pk=job.pk).update(key="order-7")
    holder = schedule(tasks.record, in_=3600, args=["a"], key="order-7")
    return job, holder


def _finish_holders_before_lookup(monkeypatch, *, rival: bool = False) -> list[int]:
    """Each lookup of the key's holder after the refused UPDATE first sees the holder
    finish (a worker's commit); with ``rival``, another job takes the key right after."""
    real, calls = services._existing, []

    def lookup(row: Job) -> Job | None:
        calls.append(1)
        holders = Job.objects.filter(queue=row.queue, key=row.key, status__in=ACTIVE)
        holders.update(status=Status.SUCCEEDED)
        found = real(row)
        if rival:
            build_job(tasks.record, in_=3600, args=["r"], key=row.key).save(force_insert=True)
        return found

    monkeypatch.setattr(services, "_existing", lookup)
    return calls


@pytest.mark.parametrize("via", ["service", "api", "admin"])
def test_a_requeue_whose_key_holder_finishes_meanwhile_is_requeued(monkeypatch, via):
    """The key's constraint refused the UPDATE, and the holder had finished when it was
    looked up: a bare ``raise`` of the IntegrityError (the API's 500, the admin's action
    failed part-way). The UPDATE is tried again, and wins."""
    job, _ = _dead_and_held()
    calls = _finish_holders_before_lookup(monkeypatch)
    if via == "service":
        assert services.requeue(job) is True
    elif via == "api":
        api = client_for(make_user(superuser=True))
        response = api.post(url("jobs", job.pk, "requeue"), {}, format="json")
        assert response.status_code == 200, response.content[:300]
    else:
        admin = client_for(make_user(superuser=True))
        changelist = reverse("admin:django_delayjobs_job_changelist")
        body = {"action": "requeue_dead", "_selected_action": [str(job.pk)], "index": "0"}
        response = admin.post(changelist, body, follow=True)
        assert [str(m) for m in response.context["messages"]] == ["1 dead job requeued."]
    assert calls == [1]
    assert Job.objects.get(pk=job.pk).status == Status.SCHEDULED


@pytest.mark.parametrize("via", ["service", "api", "admin"])
def test_a_requeue_whose_key_is_taken_each_time_says_so(monkeypatch, via):
    """Each UPDATE refused, each holder gone when looked up (a rival takes the key
    after): a bounded number of tries, then ``InvalidSchedule`` (the API's 409, the
    admin's message for that job), not an IntegrityError."""
    job, _ = _dead_and_held()
    other = dead_job()
    calls = _finish_holders_before_lookup(monkeypatch, rival=True)
    said = "the key 'order-7' was taken by another job as this one was requeued: try again"
    if via == "service":
        with pytest.raises(services.InvalidSchedule, match=said):
            services.requeue(job)
    elif via == "api":
        api = client_for(make_user(superuser=True))
        response = api.post(url("jobs", job.pk, "requeue"), {}, format="json")
        assert response.status_code == 409, response.content[:300]
        assert response.json() == {"detail": f"Cannot requeue: {said}.", "status": "dead"}
    else:
        admin = client_for(make_user(superuser=True))
        changelist = reverse("admin:django_delayjobs_job_changelist")
        body = {"action": "requeue_dead", "_selected_action": [str(job.pk), str(other.pk)],
                "index": "0"}  # fmt: skip
        response = admin.post(changelist, body, follow=True)
        assert sorted(str(m) for m in response.context["messages"]) == [
            "1 dead job requeued.", f"Job {job.pk} was not requeued: {said}."
        ]  # fmt: skip
        assert Job.objects.get(pk=other.pk).status == Status.SCHEDULED
    assert len(calls) == 3
    assert Job.objects.get(pk=job.pk).status == Status.DEAD


# -- 4. an admin action stopped by a database error reports what it did -------------------


def _fails_at_update(nth: int) -> Any:
    """An execute wrapper: the ``nth`` UPDATE of the jobs' table fails."""
    updates: list[str] = []

    def wrapper(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        if sql.lstrip().upper().startswith("UPDATE") and Job._meta.db_table in sql:
            updates.append(sql)
            if len(updates) == nth:
                raise OperationalError("the server closed the connection")
        return execute(sql, params, many, context)

    return wrapper


def _cancel_three_the_second_failing() -> tuple[Any, str]:
    """Post "Cancel selected jobs" for three jobs; the second one's UPDATE fails."""
    jobs = [schedule(tasks.record, in_=3600, args=[n]) for n in range(3)]
    admin = client_for(make_user(superuser=True))
    admin.raise_request_exception = False  # a 500 is a status to assert on, not a raise
    changelist = reverse("admin:django_delayjobs_job_changelist")
    body = {"action": "cancel_jobs", "_selected_action": [str(j.pk) for j in jobs], "index": "0"}
    with connection.execute_wrapper(_fails_at_update(2)):
        response = admin.post(changelist, body)
    assert response.status_code == 500
    return admin, changelist


def test_an_admin_action_stopped_by_a_database_error_reports_what_it_did():
    """Each job commits on its own, but the action's messages were added after its loop:
    a database error at the second job (a 500) left the first cancelled and said nothing
    of it. The messages say what was done, and that the error stopped the rest."""
    admin, changelist = _cancel_three_the_second_failing()
    cancelled = Job.objects.filter(status=Status.CANCELLED).count()
    assert cancelled == 1 and Job.objects.filter(status=Status.SCHEDULED).count() == 2
    shown = [str(m) for m in admin.get(changelist).context["messages"]]
    assert shown == [
        "1 job cancelled.",
        "A database error (OperationalError) stopped the action: the job it was changing "
        "and those after it were left as they were.",
    ]


def test_an_admin_action_stopped_by_a_database_error_under_atomic_requests(atomic_requests):
    """The actions run outside ``ATOMIC_REQUESTS`` (job by job): the same report."""
    admin, changelist = _cancel_three_the_second_failing()
    assert Job.objects.filter(status=Status.SCHEDULED).count() == 2
    shown = [str(m) for m in admin.get(changelist).context["messages"]]
    assert shown[0] == "1 job cancelled." and len(shown) == 2


def test_operations_in_a_transaction_of_the_caller_report_nothing_it_undoes():
    """Called within a transaction (not the admin's own way), a database error undoes
    every change: none is reported as made."""
    jobs = [schedule(tasks.record, in_=3600, args=[n]) for n in range(2)]
    said: list[str] = []
    request = RequestFactory().post("/")
    request.user = make_user(superuser=True)
    failing = connection.execute_wrapper(_fails_at_update(2))
    with pytest.raises(OperationalError), transaction.atomic(), failing:
        operations.cancel(request, jobs, lambda request, text, level: said.append(text))
    assert said == [] and Job.objects.filter(status=Status.SCHEDULED).count() == 2
