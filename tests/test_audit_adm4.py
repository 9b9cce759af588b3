"""The admin, fourth audit: the jobs' database down, the queue page at scale, purge."""

from __future__ import annotations

import re

import pytest
import redis.connection
from django.contrib.messages import get_messages
from django.urls import reverse
from django.utils import timezone

from django_delayjobs import schedule, sql
from django_delayjobs.admin.queue_views import QUEUES_SHOWN
from django_delayjobs.models import Job, Status
from tests.helpers import purge_with_a_death_between, run_on_two_databases
from tests.testapp import tasks

from .test_rest_helpers import dead_job

QUEUES = "admin:django_delayjobs_queues"

#: The project's database (users, sessions) up; the jobs' ("jobs") a file SQLite cannot
#: open (its directory does not exist). Prints each page's status and whether it holds a
#: traceback or the word "jobs" as the alias named.
JOBS_DOWN = """
import json
import uuid

import django

django.setup()
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.test.utils import setup_test_environment

call_command("migrate", verbosity=0)
setup_test_environment()  # ALLOWED_HOSTS for the test client
client = Client(raise_request_exception=False)
client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw"))
pk = str(uuid.uuid4())
base = "/admin/django_delayjobs/job/"
pages = {
    "changelist": client.get(base),
    "change": client.get(f"{base}{pk}/change/"),
    "queues": client.get(f"{base}queues/"),
    "action": client.post(base, {"action": "cancel_jobs", "_selected_action": [pk]}),
    "requeue": client.post(f"{base}queues/requeue/", {"one": pk}),
}
print(json.dumps({name: [r.status_code, r.content.decode()] for name, r in pages.items()}))
"""


def test_the_job_pages_say_the_jobs_database_cannot_be_reached(redis_url, tmp_path):
    """With the jobs' database alias down (the project's up), every job page was a 500
    with a traceback; now a 503 that names the alias and says what is wrong."""
    pages = run_on_two_databases(JOBS_DOWN, redis_url, tmp_path)
    for name, (status, body) in pages.items():
        assert status == 503, (name, status, body[-3000:])
        assert "The jobs database “jobs” cannot be reached" in body, name
        assert "Traceback" not in body, name


# -- purge: what is confirmed is what was shown ------------------------------------------


def die(job: Job) -> None:
    """The job dies now, as a worker records it: its row and its "dead" event."""
    assert sql.bury_unreadable(str(job.pk), "boom", "worker:w1", timezone.now())


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("page", ["select all", "queue page"])
def test_a_job_that_died_after_the_purge_confirmation_was_shown_is_not_purged(admin_client, page):
    """The confirmation posted the selection again ("select all": the filter; the queue
    page: the ids, a job not dead among them said to be left alone), read anew: a job that
    died after the operator read the page was purged, never having been shown."""
    shown, later = dead_job(), schedule(tasks.record, in_=3600, args=["a"])
    response = purge_with_a_death_between(admin_client, page, shown, later, die)
    assert not Job.objects.filter(pk=shown.pk).exists()
    assert Job.objects.filter(pk=later.pk, status=Status.DEAD).exists()
    said = [str(m) for m in get_messages(response.wsgi_request)]
    assert f"Job {later.pk} was not purged: it died after the confirmation was shown." in said


# -- purge: the admin log on the project's database, the jobs on their own -------------

#: Job on a database of its own ("jobs"), with a table the models do not know of that
#: refers to a dead job by a deferred foreign key: the database refuses its purge only
#: when it commits. Prints whether the job is still there and the admin log's entries.
PURGE_REFUSED_AT_COMMIT = """
import json
from datetime import timedelta

import django

django.setup()
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connections
from django.test import Client
from django.test.utils import setup_test_environment
from django.utils import timezone

call_command("migrate", verbosity=0)
call_command("migrate", database="jobs", verbosity=0)
from django_delayjobs import schedule, sql
from django_delayjobs.models import Job, Status
from tests.helpers import confirm_purge
from tests.testapp import tasks
from tests.testapp.models import Receipt

job = schedule(tasks.record, in_=timedelta(hours=1), args=["a"])
Job.objects.filter(pk=job.pk).update(status=Status.DEAD, finished_at=timezone.now())
with connections["jobs"].schema_editor() as editor:  # Receipt refers to Job: the
    editor.create_model(Receipt)  # purge's collector looks on the jobs' database
with connections["jobs"].cursor() as cursor:
    cursor.execute("CREATE TABLE hold (job_id char(32) REFERENCES django_delayjobs_job (id)"
                   " DEFERRABLE INITIALLY DEFERRED)")
    cursor.execute("INSERT INTO hold VALUES (%s)", [job.pk.hex])
setup_test_environment()
client = Client()
client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw"))
confirm_purge(client, "/admin/django_delayjobs/job/queues/purge/", {"job": str(job.pk)})
print(json.dumps({
    "kept": Job.objects.filter(pk=job.pk).exists(),
    "logged": list(LogEntry.objects.values_list("object_id", flat=True)),
}))
"""


def test_a_purge_the_jobs_database_refuses_at_commit_leaves_no_admin_log_entry(redis_url, tmp_path):
    """The admin log (on the project's database) was written, and committed, inside the
    purge's transaction on the jobs' database: when that one's commit failed the job
    stayed, and the log said it was purged."""
    said = run_on_two_databases(PURGE_REFUSED_AT_COMMIT, redis_url, tmp_path, jobs_down=False)
    assert said == {"kept": True, "logged": []}


# -- the queue page: one round trip to Redis for all the queues it shows -----------------


@pytest.fixture
def round_trips(monkeypatch):
    """How many times a client wrote to a Redis socket (a pipeline writes once)."""
    sent = []
    real = redis.connection.AbstractConnection.send_packed_command

    def send(self, command, check_health=True):
        sent.append(command)
        return real(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", send)
    return sent


@pytest.mark.django_db(transaction=True)
def test_the_queue_page_reads_redis_in_one_round_trip_for_all_its_queues(admin_client, round_trips):
    """It made about seven calls per queue (counts, next due, dead ids, the workers'
    time, heartbeats and descriptions), one after another."""
    dead_job()
    for i in range(30):
        schedule(tasks.record, in_=3600, args=["a"], queue=f"q{i:02}")
    admin_client.get(reverse(QUEUES))  # the scripts loaded, the directory read once
    round_trips.clear()
    html = admin_client.get(reverse(QUEUES)).content.decode()
    assert html.count('<tr data-queue="') == 31
    assert len(round_trips) <= 3, len(round_trips)  # directory, queues, chart history


@pytest.mark.django_db(transaction=True)
def test_the_queue_page_shows_a_page_of_queues_and_says_how_many_more(admin_client):
    for i in range(QUEUES_SHOWN + 2):
        schedule(tasks.record, in_=3600, args=["a"], queue=f"q{i:03}")
    names = ["default", *(f"q{i:03}" for i in range(QUEUES_SHOWN + 2))]
    html = admin_client.get(reverse(QUEUES)).content.decode()
    shown = re.findall(r'<tr data-queue="([^"]+)"', html)
    assert shown == names[:QUEUES_SHOWN]
    assert "3 more queues" in html and "?page=2" in html
    html = admin_client.get(reverse(QUEUES), {"page": "2"}).content.decode()
    assert re.findall(r'<tr data-queue="([^"]+)"', html) == names[QUEUES_SHOWN:]
    assert admin_client.get(reverse(QUEUES), {"page": "x"}).status_code == 200
