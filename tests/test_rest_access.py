"""Who may do what: API_PERMISSION_CLASSES (admin-only by default) for every request, and on
top of them the admin's model permissions: django_delayjobs.view_job (or change_job) to
read, django_delayjobs.change_job to write, whatever those classes say (finding 12)."""

from __future__ import annotations

import pytest
from rest_framework.permissions import IsAuthenticated

from django_delayjobs import schedule
from django_delayjobs.checks import check_settings
from django_delayjobs.models import Job, Status
from django_delayjobs.rest.permissions import configured_permissions
from tests.testapp import tasks

from .test_rest_helpers import client_for, make_user, snapshot, url

pytestmark = pytest.mark.django_db(transaction=True)

READS = [("jobs",), ("jobs", "{pk}"), ("queues",)]
WRITES = [("cancel", {}), ("reschedule", {"in": 60}), ("requeue", {})]


@pytest.fixture
def job():
    return schedule(tasks.record, in_=3600, args=["x"])


def read_statuses(api, job) -> list[int]:
    paths = [url(*(str(p).format(pk=job.pk) for p in parts)) for parts in READS]
    return [api.get(path).status_code for path in paths]


def write(api, job, verb, body):
    return api.post(url("jobs", job.pk, verb), body, format="json")


@pytest.fixture
def relaxed(settings):
    def relax(*classes: str) -> None:
        settings.DELAYJOBS = {**settings.DELAYJOBS, "API_PERMISSION_CLASSES": list(classes)}

    return relax


# -- the default: staff only --------------------------------------------------------------


def test_anonymous_gets_403_everywhere(job):
    api = client_for(None)
    assert read_statuses(api, job) == [403, 403, 403]
    for verb, body in WRITES:
        assert write(api, job, verb, body).status_code == 403


def test_a_user_who_is_not_staff_gets_403_everywhere(job):
    api = client_for(make_user(staff=False, perms=("change_job",)))
    assert read_statuses(api, job) == [403, 403, 403]
    for verb, body in WRITES:
        assert write(api, job, verb, body).status_code == 403


def test_staff_without_view_job_cannot_read(job):
    """Finding 12: the admin refuses a staff user without view_job, and so does the API."""
    api = client_for(make_user(perms=()))
    assert read_statuses(api, job) == [403, 403, 403]
    response = api.get(url("jobs", job.pk))
    assert "django_delayjobs.view_job" in response.data["detail"]
    assert "args" not in response.data


def test_change_job_alone_lets_staff_read_as_in_the_admin(job):
    assert read_statuses(client_for(make_user(perms=("change_job",))), job) == [200, 200, 200]


@pytest.mark.parametrize(("verb", "body"), WRITES)
def test_staff_without_change_job_reads_but_cannot_write(job, verb, body):
    api = client_for(make_user(perms=("view_job",)))
    assert read_statuses(api, job) == [200, 200, 200]
    before = snapshot(job)
    response = write(api, job, verb, body)
    assert response.status_code == 403
    assert "django_delayjobs.change_job" in response.data["detail"]
    assert snapshot(job) == before


def test_staff_with_change_job_can_write(job):
    api = client_for(make_user("bob", perms=("change_job",)))
    assert write(api, job, "reschedule", {"in": 5}).status_code == 200
    assert write(api, job, "cancel", {}).status_code == 200
    assert list(job.events.values_list("actor", flat=True)) == ["code", "api:bob", "api:bob"]


@pytest.mark.parametrize("verb", ["cancel", "reschedule", "requeue"])
def test_options_does_not_offer_a_write_to_a_user_who_may_only_read(job, verb):
    """OPTIONS on jobs/<id>/cancel/ (reschedule/, requeue/) answered a view_job holder with
    "actions": {"POST": ...}, as if it could POST: the permissions were those of the
    "metadata" action (a read), not of the verb the method names."""
    viewer = client_for(make_user("viewer", perms=("view_job",)))
    response = viewer.options(url("jobs", job.pk, verb))
    assert response.status_code == 200
    assert "actions" not in response.json()
    operator = client_for(make_user("operator", perms=("change_job",)))
    assert "POST" in operator.options(url("jobs", job.pk, verb)).json()["actions"]


def test_a_superuser_holds_change_job_without_being_given_it(job):
    api = client_for(make_user(superuser=True))
    assert read_statuses(api, job) == [200, 200, 200]
    assert write(api, job, "cancel", {}).status_code == 200


def test_a_superuser_who_is_not_staff_is_refused_by_is_admin_user(job):
    # IsAdminUser means is_staff, as in DRF; a project can list another class
    assert read_statuses(client_for(make_user(staff=False, superuser=True)), job) == [403] * 3


# -- relaxed or tightened classes ---------------------------------------------------------


def test_relaxed_classes_open_reads_to_view_job_holders_and_writes_to_change_job(job, relaxed):
    relaxed("rest_framework.permissions.IsAuthenticated")
    assert read_statuses(client_for(make_user("carl", staff=False)), job) == [403, 403, 403]
    reader = client_for(make_user("bea", staff=False, perms=("view_job",)))
    assert read_statuses(reader, job) == [200, 200, 200]
    assert write(reader, job, "cancel", {}).status_code == 403
    assert read_statuses(client_for(None), job) == [403, 403, 403]
    allowed = client_for(make_user("dora", staff=False, perms=("change_job",)))
    assert write(allowed, job, "cancel", {}).status_code == 200


def test_allow_any_still_keeps_anonymous_reads_and_writes_out(job, relaxed):
    relaxed("rest_framework.permissions.AllowAny")
    anonymous = client_for(None)
    assert read_statuses(anonymous, job) == [403, 403, 403]
    assert write(anonymous, job, "cancel", {}).status_code == 403
    assert Job.objects.get(pk=job.pk).status == Status.SCHEDULED


def test_an_empty_list_leaves_only_the_model_permissions(job, relaxed):
    relaxed()
    assert read_statuses(client_for(None), job) == [403, 403, 403]
    reader = client_for(make_user("fay", staff=False, perms=("view_job",)))
    assert read_statuses(reader, job) == [200, 200, 200]


def test_classes_are_combined_with_and(job, relaxed):
    relaxed("rest_framework.permissions.IsAdminUser", "rest_framework.permissions.IsAuthenticated")
    assert read_statuses(client_for(make_user(staff=False, perms=("view_job",))), job) == [
        403, 403, 403,
    ]  # fmt: skip
    assert read_statuses(client_for(make_user("ed", perms=("view_job",))), job) == [200, 200, 200]


def test_classes_may_be_given_as_objects(settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "API_PERMISSION_CLASSES": [IsAuthenticated]}
    assert configured_permissions() == [IsAuthenticated]


@pytest.mark.parametrize(
    "value",
    [
        "rest_framework.permissions.IsAdminUser",
        ["rest_framework.permissions.NoSuchClass"],
        ["no_such_module.Permission"],
        ["rest_framework.permissions.SAFE_METHODS"],
    ],
)
def test_system_check_reports_bad_permission_classes(settings, value):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "API_PERMISSION_CLASSES": value}
    errors = check_settings()
    assert [e.id for e in errors] == ["django_delayjobs.E008"]
    assert "API_PERMISSION_CLASSES" in errors[0].msg


def test_system_check_accepts_good_permission_classes(settings):
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "API_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    }
    assert check_settings() == []
