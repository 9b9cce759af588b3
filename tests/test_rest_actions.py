"""POST cancel / reschedule / requeue: 200 when the verb won, 409 when too late, 400 for bad
input with nothing written; CSRF for session auth; the user recorded as the actor."""

from __future__ import annotations

import base64
import datetime
import uuid

import pytest
from django.utils import timezone

from django_delayjobs import schedule
from django_delayjobs.models import Job, Status
from tests.testapp import tasks

from .test_rest_helpers import (
    burst,
    client_for,
    dead_job,
    due_in_redis,
    events,
    make_user,
    redis_state,
    running,
    snapshot,
    url,
)

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
MS = datetime.timedelta(milliseconds=1)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def api():
    return client_for(make_user(superuser=True))


@pytest.fixture
def job():
    return schedule(tasks.record, in_=3600, args=["x"])


def post(api, job_or_id, verb, body=None):
    pk = job_or_id.pk if isinstance(job_or_id, Job) else job_or_id
    return api.post(url("jobs", pk, verb), body, format="json")


# -- cancel ---------------------------------------------------------------------------------


def test_cancel_in_time_is_200_with_the_job_and_its_event(api, job):
    response = post(api, job, "cancel")
    assert response.status_code == 200
    assert response.data["id"] == str(job.pk) and response.data["status"] == "cancelled"
    assert (response.data["events"][-1]["kind"], response.data["events"][-1]["actor"]) == (
        "cancelled", "api:ada",
    )  # fmt: skip
    assert Job.objects.get(pk=job.pk).status == Status.CANCELLED
    assert due_in_redis(job) is None  # removed from Redis on commit


def test_cancel_accepts_an_empty_object(api, job):
    assert post(api, job, "cancel", {}).status_code == 200


def test_cancel_twice_is_409_with_the_status(api, job):
    assert post(api, job, "cancel").status_code == 200
    response = post(api, job, "cancel")
    assert response.status_code == 409
    assert response.data == {
        "detail": "Too late to cancel: the job has started or finished.", "status": "cancelled",
    }  # fmt: skip
    assert events(job) == [("scheduled", "code"), ("cancelled", "api:ada")]


def test_cancel_of_a_running_job_is_409_and_leaves_it_running(api, job):
    running(job)
    response = post(api, job, "cancel")
    assert (response.status_code, response.data["status"]) == (409, "running")
    assert Job.objects.get(pk=job.pk).status == Status.RUNNING


def test_cancel_of_a_job_that_ran_is_409(api):
    job = schedule(tasks.record, in_=0, args=["now"])
    burst()
    response = post(api, job, "cancel")
    assert (response.status_code, response.data["status"]) == (409, "succeeded")


def test_cancel_with_a_field_is_400_and_writes_nothing(api, job):
    before = snapshot(job)
    response = post(api, job, "cancel", {"force": True})
    assert response.status_code == 400
    assert list(response.data) == ["force"]
    assert snapshot(job) == before


# -- reschedule -----------------------------------------------------------------------------


def test_reschedule_in_seconds_moves_row_and_redis(api, job):
    before = timezone.now()
    response = post(api, job, "reschedule", {"in": 90.5})
    assert response.status_code == 200
    job.refresh_from_db()
    assert before + datetime.timedelta(seconds=90) < job.run_at
    assert job.run_at < timezone.now() + datetime.timedelta(seconds=91)
    assert response.data["run_at"] == job.run_at.isoformat().replace("+00:00", "Z")
    assert due_in_redis(job) == (job.run_at - EPOCH) / MS  # to the microsecond
    assert events(job)[-1] == ("rescheduled", "api:ada")


def test_reschedule_in_zero_makes_it_due_now(api, job):
    assert post(api, job, "reschedule", {"in": 0}).status_code == 200
    burst()
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED


def test_reschedule_at_an_aware_time_in_any_offset(api, job):
    at = datetime.datetime(
        2031, 5, 1, 11, 30, tzinfo=datetime.timezone(datetime.timedelta(hours=2))
    )
    response = post(api, job, "reschedule", {"at": at.isoformat()})
    assert response.status_code == 200
    job.refresh_from_db()
    assert job.run_at == at
    assert response.data["run_at"] == "2031-05-01T09:30:00Z"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "non_field_errors"),
        ({"in": 60, "at": "2031-01-01T00:00:00Z"}, "non_field_errors"),
        ({"in": -1}, "in"),
        ({"in": "soon"}, "in"),
        ({"in": 1e12}, "in"),  # more than 100 years away
        ({"in": 1e308}, "in"),
        ({"in": "Infinity"}, "in"),
        ({"in": True}, "in"),
        ({"at": "2031-01-01T09:00:00"}, "at"),  # naive
        ({"at": "2031-01-01"}, "at"),  # a date is a naive midnight
        ({"at": "next tuesday"}, "at"),
        ({"at": 1893456000}, "at"),
        ({"in": 60, "when": "now"}, "when"),
        (["in", 60], "non_field_errors"),
    ],
)
def test_bad_reschedule_is_400_with_field_errors_and_writes_nothing(api, job, body, field):
    before = snapshot(job)
    response = post(api, job, "reschedule", body)
    assert response.status_code == 400, response.data
    assert field in response.data
    assert snapshot(job) == before


def test_reschedule_past_expiry_is_400_on_the_field(api):
    job = schedule(tasks.record, in_=60, args=["x"], expires=120)
    before = snapshot(job)
    response = post(api, job, "reschedule", {"in": 3600})
    assert response.status_code == 400
    assert "expires" in str(response.data["in"][0])
    assert snapshot(job) == before


def test_reschedule_of_a_running_job_is_409(api, job):
    running(job)
    response = post(api, job, "reschedule", {"in": 60})
    assert (response.status_code, response.data["status"]) == (409, "running")
    assert response.data["detail"] == "Too late to reschedule: the job has started or finished."


# -- requeue --------------------------------------------------------------------------------


def test_requeue_of_a_dead_job_gives_it_more_attempts(api):
    job = dead_job()
    response = post(api, job, "requeue", {"attempts": 2})
    assert response.status_code == 200
    assert (response.data["status"], response.data["attempts"], response.data["max_attempts"]) == (
        "scheduled", 1, 3,
    )  # fmt: skip
    assert events(job)[-1] == ("requeued", "api:ada")
    assert redis_state(job) in ("pending", "ready")  # out of the garbage, due now
    burst()  # and a worker runs it again
    assert Job.objects.get(pk=job.pk).attempts == 2


def test_requeue_defaults_to_max_attempts_more(api, settings):
    job = dead_job()
    assert post(api, job, "requeue").status_code == 200
    assert Job.objects.get(pk=job.pk).max_attempts == 1 + settings.DELAYJOBS.get("MAX_ATTEMPTS", 5)


def test_requeue_of_a_job_that_is_not_dead_is_409(api, job):
    response = post(api, job, "requeue")
    assert response.status_code == 409
    assert response.data == {"detail": "Only dead jobs can be requeued.", "status": "scheduled"}


def test_requeue_of_a_dead_job_whose_key_another_job_holds_is_409(api):
    job = dead_job()
    Job.objects.filter(pk=job.pk).update(key="order-7")
    holder = schedule(tasks.record, in_=60, args=["x"], key="order-7")
    response = post(api, job, "requeue")
    assert response.status_code == 409
    assert response.data == {
        "detail": f"Cannot requeue: job {holder.pk} holds the key 'order-7' now: cancel it first.",
        "status": "dead",
    }


def test_requeue_of_a_dead_job_past_its_expiry_is_409(api):
    job = dead_job()
    expired = timezone.now() - datetime.timedelta(minutes=1)
    Job.objects.filter(pk=job.pk).update(expires_at=expired)
    response = post(api, job, "requeue")
    assert response.status_code == 409
    assert response.data == {
        "detail": f"Cannot requeue: the job expired at {expired.isoformat()}: it would be "
        "skipped at once.",
        "status": "dead",
    }


@pytest.mark.parametrize(
    ("body", "field"),
    [({"attempts": 0}, "attempts"), ({"attempts": "many"}, "attempts"),
     ({"attempts": 5001}, "attempts"), ({"attempts": 2, "queue": "x"}, "queue")],
)  # fmt: skip
def test_bad_requeue_is_400_and_writes_nothing(api, body, field):
    job = dead_job()
    before = snapshot(job)
    response = post(api, job, "requeue", body)
    assert (response.status_code, list(response.data)) == (400, [field])
    assert snapshot(job) == before


# -- ids, actor, CSRF -----------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["cancel", "reschedule", "requeue"])
def test_writes_to_unknown_or_malformed_ids_are_404(api, verb):
    assert (
        post(api, uuid.uuid4(), verb, {"in": 1} if verb == "reschedule" else None).status_code
        == 404
    )
    response = post(api, "not-a-uuid", verb)
    assert response.status_code == 404 and "UUID" in response.data["detail"]


def test_actor_is_cut_to_the_column_length(job):
    long_name = "u" * 150  # the longest username Django allows
    api = client_for(make_user(long_name, superuser=True))
    assert post(api, job, "cancel").status_code == 200
    assert events(job)[-1] == ("cancelled", f"api:{long_name}"[:150])


def test_session_auth_needs_the_csrf_token(job):
    api = client_for(make_user(superuser=True), csrf=True)
    refused = post(api, job, "cancel")
    assert refused.status_code == 403 and "CSRF" in refused.data["detail"]
    assert Job.objects.get(pk=job.pk).status == Status.SCHEDULED
    token = "k" * 32  # the form Django's CSRF cookie takes; the header must match it
    api.cookies["csrftoken"] = token
    wrong = api.post(url("jobs", job.pk, "cancel"), {}, format="json", HTTP_X_CSRFTOKEN="j" * 32)
    assert wrong.status_code == 403
    response = api.post(url("jobs", job.pk, "cancel"), {}, format="json", HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 200


def test_a_form_post_with_its_csrf_token_field_is_accepted(job):
    api = client_for(make_user(superuser=True), csrf=True)
    api.cookies["csrftoken"] = token = "k" * 32
    body = {"csrfmiddlewaretoken": token, "in": "30"}
    response = api.post(url("jobs", job.pk, "reschedule"), body)  # form-encoded, as HTML forms
    assert response.status_code == 200, response.data
    response = api.post(url("jobs", job.pk, "cancel"), {"csrfmiddlewaretoken": token})
    assert response.status_code == 200


def test_basic_auth_needs_no_csrf_token(job):
    make_user(superuser=True)
    api = client_for(None, csrf=True)
    credentials = base64.b64encode(b"ada:pw").decode()
    api.credentials(HTTP_AUTHORIZATION=f"Basic {credentials}")
    assert post(api, job, "cancel").status_code == 200
    assert events(job)[-1] == ("cancelled", "api:ada")


def test_a_write_works_while_redis_is_down(api, job, settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": "redis://127.0.0.1:1/0"}
    response = post(api, job, "cancel")
    assert (response.status_code, response.data["status"]) == (200, "cancelled")
