"""The admin, third audit: poison rows, ATOMIC_REQUESTS, stale garbage, lost content types."""

from __future__ import annotations

import time

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.contenttypes.models import ContentType
from django.contrib.messages import get_messages
from django.db import connection
from django.urls import reverse

from django_delayjobs import schedule, services
from django_delayjobs.connection import SOCKET_TIMEOUT, get_engine
from django_delayjobs.models import Job, Status
from django_delayjobs.reconcile import horizon, reconcile
from tests.testapp.models import Thing

from .helpers import confirm_purge
from .test_poison import plant
from .test_rest_helpers import client_for, dead_job, url

pytestmark = pytest.mark.django_db(transaction=True)


CHANGELIST = "admin:django_delayjobs_job_changelist"
QUEUES = "admin:django_delayjobs_queues"

#: Poison rows SQLite and PostgreSQL both store: values Python's JSON parser refuses.
JSON_POISON = ["args nested 1500 deep", "kwargs 5000-digit int", "result nested 1500 deep"]


def status_of(job: Job) -> str | None:
    return Job.objects.filter(pk=job.pk).values_list("status", flat=True).first()


# -- poison rows: the buttons the pages offer for them work -----------------------------


@pytest.mark.parametrize("name", JSON_POISON)
def test_a_dead_poison_row_is_requeued_from_the_job_list_and_the_queue_page(admin_client, name):
    """The queue page lists a dead job whose JSON Python cannot parse, with its buttons,
    but requeue read the row the ordinary way (the queue page's posted jobs, and the
    service's refresh after its UPDATE): a 500, from the job list's action too."""
    listed, buttoned = dead_job(), dead_job()
    plant(listed, name)
    plant(buttoned, name)
    page = admin_client.get(reverse(QUEUES)).content.decode()
    assert f'name="one" value="{buttoned.pk}"' in page
    selection = {"action": "requeue_dead", ACTION_CHECKBOX_NAME: [str(listed.pk)], "index": "0"}
    assert admin_client.post(reverse(CHANGELIST), selection).status_code == 302
    response = admin_client.post(reverse(f"{QUEUES}_requeue"), {"one": str(buttoned.pk)})
    assert response.status_code == 302
    assert status_of(listed) == status_of(buttoned) == Status.SCHEDULED
    assert get_engine().stats("default").garbage == 0


@pytest.mark.parametrize("name", JSON_POISON)
def test_a_dead_poison_row_is_purged_from_the_job_list_and_the_queue_page(admin_client, name):
    """Purge is how a poison row is cleared away, but it deleted through Django's
    collector, which reads every column of the row: a 500, on the confirmation of the
    queue page's button and on the purge itself, from either page."""
    listed, buttoned = dead_job(), dead_job()
    plant(listed, name)
    plant(buttoned, name)
    selection = {"action": "purge_dead", ACTION_CHECKBOX_NAME: [str(listed.pk)], "index": "0"}
    assert admin_client.post(reverse(CHANGELIST), selection).status_code == 200  # asks
    response = confirm_purge(admin_client, reverse(CHANGELIST), selection)
    assert response.status_code == 302
    button = {"one": str(buttoned.pk)}
    response = admin_client.post(reverse(f"{QUEUES}_purge"), button)
    assert response.status_code == 200 and "Yes, purge them" in response.content.decode()
    response = confirm_purge(admin_client, reverse(f"{QUEUES}_purge"), button)
    assert response.status_code == 302
    assert status_of(listed) is None and status_of(buttoned) is None
    assert get_engine().stats("default").garbage == 0


def test_the_api_answers_a_requeued_poison_row_with_its_new_state(admin_user):
    """The API shows the job the service requeued: the service refreshes the caller's
    copy, tolerantly, so the answer says scheduled, not dead."""
    dead = dead_job()
    plant(dead, "kwargs 5000-digit int")
    response = client_for(admin_user).post(url("jobs", dead.pk, "requeue"), {}, format="json")
    assert response.status_code == 200
    assert response.json()["status"] == Status.SCHEDULED


def test_the_services_given_a_poison_rows_id_change_it():
    """Given an id, the services read the row the ordinary way: a ValueError (or a
    RecursionError) for a poison row, which only its id can name."""
    requeued, purged = dead_job(), dead_job()
    plant(requeued, "kwargs 5000-digit int")
    plant(purged, "args nested 1500 deep")
    assert services.requeue(str(requeued.pk)) is True
    assert services.cancel(requeued.pk) is True
    assert services.purge(purged.pk) is True
    assert status_of(requeued) == Status.CANCELLED and status_of(purged) is None


# -- ATOMIC_REQUESTS: the actions' Redis calls run after the request's commit -------------


@pytest.mark.slow
@pytest.mark.parametrize("page", ["job list", "queue page"])
def test_an_action_under_atomic_requests_while_redis_does_not_answer_waits_once(
    admin_client, frozen_redis, settings, atomic_requests, page
):
    """With ``ATOMIC_REQUESTS`` the request's transaction held every change, so each job's
    Redis call ran at the request's commit, after the action had stopped skipping them:
    each waited for the read timeout (a page of 100 jobs took 100 s), and the page did
    not say Redis was down. The actions commit job by job, as without it."""
    jobs = [dead_job() for _ in range(4)]
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": frozen_redis}
    ids = [str(job.pk) for job in jobs]
    started = time.monotonic()
    if page == "job list":
        selection = {"action": "requeue_dead", ACTION_CHECKBOX_NAME: ids, "index": "0"}
        response = admin_client.post(reverse(CHANGELIST), selection)
    else:
        response = admin_client.post(reverse(f"{QUEUES}_requeue"), {"job": ids})
    took = time.monotonic() - started
    assert response.status_code == 302
    messages = [str(m) for m in get_messages(response.wsgi_request)]
    assert "4 dead jobs requeued." in messages
    assert any(m.startswith("Redis did not answer") for m in messages), messages
    assert took < 3 * SOCKET_TIMEOUT, took  # one call's wait, not one a job
    assert Job.objects.filter(status=Status.SCHEDULED).count() == 4


# -- garbage: an id whose job is no longer dead ---------------------------------------------


def test_a_garbage_id_whose_job_finished_otherwise_can_be_forgotten(admin_client, settings):
    """A dead job requeued while Redis was unreachable, then cancelled before reconcile
    revived it, stayed in its queue's Redis garbage: the workers' sweep looks at waiting
    jobs only (a full pass, ``delayjobs_reconcile``, now takes such ids out), and the queue
    page offered no button (not dead: no purge; a row: no forget), so it counted as
    garbage until its row was pruned. Forget takes an id whose job is not dead."""
    dead = dead_job()
    reachable = settings.DELAYJOBS
    settings.DELAYJOBS = {**reachable, "REDIS_URL": "redis://127.0.0.1:1/0"}
    for action in ("requeue_dead", "cancel_jobs"):
        selection = {"action": action, ACTION_CHECKBOX_NAME: [str(dead.pk)], "index": "0"}
        admin_client.post(reverse(CHANGELIST), selection)
    settings.DELAYJOBS = reachable
    reconcile(get_engine(), horizon=horizon())
    assert status_of(dead) == Status.CANCELLED
    assert get_engine().stats("default").garbage == 1
    page = admin_client.get(reverse(QUEUES)).content.decode()
    assert f'name="one" value="{dead.pk}" formaction="{reverse(f"{QUEUES}_forget")}"' in page
    response = admin_client.post(
        reverse(f"{QUEUES}_forget"), {"queue": "default", "one": str(dead.pk)}, follow=True
    )
    messages = [str(m) for m in response.context["messages"]]
    assert messages == ["1 id forgotten from the garbage of queue default."]
    assert get_engine().stats("default").garbage == 0
    assert status_of(dead) == Status.CANCELLED  # the row is the job's record: left alone


def test_forget_leaves_the_id_of_a_dead_job_to_purge(admin_client):
    dead = dead_job()
    response = admin_client.post(
        reverse(f"{QUEUES}_forget"), {"queue": "default", "one": str(dead.pk)}, follow=True
    )
    messages = [str(m) for m in response.context["messages"]]
    assert messages == [f"Job {dead.pk} has a database row: purge it instead."]
    assert get_engine().stats("default").garbage == 1


# -- a target whose content type is gone ----------------------------------------------------


def dangle_target_type(job: Job) -> None:
    """Point ``job``'s target type at a content type that does not exist, past its
    foreign key (as with the jobs on a database of their own, whose content types
    outlive those the project removes as stale)."""
    table = connection.ops.quote_name(Job._meta.db_table)
    sql = f"UPDATE {table} SET target_type_id = 999999 WHERE id = %s"
    pk = Job._meta.pk.get_db_prep_value(job.pk, connection)
    with connection.constraint_checks_disabled(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET session_replication_role = replica")  # no foreign key check
        cursor.execute(sql, [pk])
        if connection.vendor == "postgresql":
            cursor.execute("SET session_replication_role = DEFAULT")
    ContentType.objects.clear_cache()


def test_the_pages_show_a_job_whose_target_content_type_is_gone(admin_client, admin_user):
    """The job list and page showed such a target as "-" (Django's admin catches the
    DoesNotExist), but the queue page, which lists the next due jobs and the garbage
    through the same functions, was a 500, and so were the API's jobs/ and jobs/<id>/."""
    job = schedule(Thing.objects.create(name="t").touch, in_=60)
    dangle_target_type(job)
    for page in (
        reverse(QUEUES),
        reverse(CHANGELIST),
        reverse("admin:django_delayjobs_job_change", args=[job.pk]),
    ):
        assert admin_client.get(page).status_code == 200, page
    html = admin_client.get(reverse(QUEUES)).content.decode()
    assert f"(unknown model) {job.target_id}" in html
    api = client_for(admin_user)
    for answer in (api.get(url("jobs", job.pk)).json(), api.get(url("jobs")).json()["results"][0]):
        assert (answer["target_type"], answer["target_id"]) == (None, job.target_id)
