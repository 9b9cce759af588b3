"""The admin, fifth audit: ATOMIC_REQUESTS with the jobs' database down (the admin, and
health/ and metrics/), the purge confirmation's fence, and the query parameters of the
API's ``queues/``."""

from __future__ import annotations

import datetime
import json

import pytest
from django.contrib.messages import get_messages
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from django_delayjobs import schedule, sql
from django_delayjobs.models import Job, Status
from tests.helpers import purge_with_a_death_between, run_on_two_databases
from tests.testapp import tasks

from .test_audit_adm4 import JOBS_DOWN
from .test_rest_helpers import client_for, dead_job, url

CHANGE = "admin:django_delayjobs_job_change"
QUEUES = "admin:django_delayjobs_queues"

# -- ATOMIC_REQUESTS: the request's transaction is opened where the guard sees it fail ---

#: As test_audit_adm4's JOBS_DOWN, with every view in a transaction on both databases.
ATOMIC_JOBS_DOWN = JOBS_DOWN.replace(
    "django.setup()\n",
    "django.setup()\nfrom django.db import connections\n"
    "for alias in connections:\n    connections[alias].settings_dict['ATOMIC_REQUESTS'] = True\n",
    1,
)


def test_the_job_pages_say_the_jobs_database_cannot_be_reached_under_atomic_requests(
    redis_url, tmp_path
):
    """With ``ATOMIC_REQUESTS`` Django opened the request's transaction on the jobs'
    database before the guard that answers 503 ran: the job page and the queue page
    were a 500 with a traceback."""
    pages = run_on_two_databases(ATOMIC_JOBS_DOWN, redis_url, tmp_path)
    for name, (status, body) in pages.items():
        assert status == 503, (name, status, body[-3000:])
        assert "The jobs database “jobs” cannot be reached" in body, name
        assert "Traceback" not in body, name


@pytest.mark.django_db(transaction=True)
def test_the_job_pages_still_run_in_the_request_transaction(admin_client, atomic_requests):
    """The guard opens the request's transaction itself: the read-only pages keep it."""
    job = dead_job()
    in_transaction: list[bool] = []

    def record(execute, sql, params, many, context):
        if not sql.startswith("BEGIN"):  # SQLite's transaction_mode opens it so
            in_transaction.append(connection.in_atomic_block)
        return execute(sql, params, many, context)

    for page in (reverse(CHANGE, args=[job.pk]), reverse(QUEUES)):
        in_transaction.clear()
        with connection.execute_wrapper(record):
            assert admin_client.get(page).status_code == 200
        assert in_transaction and all(in_transaction), page


# -- GET queues/ and jobs/<id>/: a parameter they do not read is a 400 ---------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("endpoint", ["queues", "job"])
def test_the_reads_without_parameters_refuse_unknown_ones(admin_user, endpoint):
    """``queues/?queue=mail`` answered every queue with a 200, as if filtered (and so did
    ``jobs/<id>/`` for any parameter), while ``jobs/`` and ``jobs/<id>/events/`` refuse a
    parameter they do not read: a typo must not answer another question."""
    job = schedule(tasks.record, in_=60, args=["a"], queue="mail")
    api = client_for(admin_user)
    parts = ("queues",) if endpoint == "queues" else ("jobs", job.pk)
    response = api.get(url(*parts), {"queue": "mail", "\x00": "1"})
    assert response.status_code == 400, response.content[:300]
    assert response.json() == {"queue": ["Unknown query parameter."],
                               "\x00": ["Unknown query parameter."]}  # fmt: skip
    response = api.get(url(*parts), {"format": ["json", "json"]})
    assert response.status_code == 200, response.content[:300]


# -- purge: the confirmation's fence does not depend on the workers' clocks ---------------

#: How far the worker's clock is from the web server's.
SKEW = datetime.timedelta(minutes=1)


def die_on_a_clock(job: Job, offset: datetime.timedelta) -> None:
    """The job dies as a worker records it, whose clock is ``offset`` from this one's."""
    assert sql.bury_unreadable(str(job.pk), "boom", "worker:w1", timezone.now() + offset)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("page", ["select all", "queue page"])
def test_a_purge_confirmation_is_judged_by_the_database_not_the_workers_clocks(admin_client, page):
    """The confirmation carried the web server's time, and a job was purged when the
    worker's clock said it died before: a job that died after the page was read, on a
    worker a minute behind, was purged unseen, and one shown dead, that died on a worker
    a minute ahead, was kept as "died after the confirmation was shown"."""
    ahead = schedule(tasks.record, in_=3600, args=["a"])
    die_on_a_clock(ahead, SKEW)
    behind = schedule(tasks.record, in_=3600, args=["b"])
    response = purge_with_a_death_between(
        admin_client, page, ahead, behind, lambda job: die_on_a_clock(job, -SKEW)
    )
    said = [str(m) for m in get_messages(response.wsgi_request)]
    assert not Job.objects.filter(pk=ahead.pk).exists(), said
    assert Job.objects.filter(pk=behind.pk, status=Status.DEAD).exists(), said
    assert f"Job {behind.pk} was not purged: it died after the confirmation was shown." in said


# -- ATOMIC_REQUESTS: health/ and metrics/ read only, and answer the database down ------

#: GET health/ and metrics/ (as staff), every view in a transaction on both databases,
#: the jobs' one down. Prints each one's status, content type and body.
PROBES_JOBS_DOWN = """
import json

import django

django.setup()
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connections
from django.test import Client
from django.test.utils import setup_test_environment

for alias in connections:
    connections[alias].settings_dict["ATOMIC_REQUESTS"] = True
call_command("migrate", verbosity=0)
setup_test_environment()
client = Client(raise_request_exception=False)
client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw"))
pages = {name: client.get(f"/delayjobs/{name}/") for name in ("health", "metrics")}
print(json.dumps({name: [r.status_code, r["Content-Type"], r.content.decode()]
                  for name, r in pages.items()}))
"""


def test_health_and_metrics_answer_the_jobs_database_down_under_atomic_requests(
    redis_url, tmp_path
):
    """Django opened the request's transaction on the jobs' database before the views
    ran: the health check, which exists to say the database is down, was a 500 HTML page
    (and metrics too, which reads Redis). Both read only, and run outside it."""
    pages = run_on_two_databases(PROBES_JOBS_DOWN, redis_url, tmp_path)
    status, kind, body = pages["health"]
    assert (status, kind) == (503, "application/json"), body[-3000:]
    assert json.loads(body)["checks"]["database"] == "fail"
    status, kind, body = pages["metrics"]
    assert status == 200 and kind.startswith("text/plain"), (status, body[-3000:])


# -- ATOMIC_REQUESTS: the API answers the jobs' database down in JSON --------------------

#: The API's reads and a write, every view in a transaction on both databases, the jobs'
#: one down. Prints each one's status, content type and body.
API_JOBS_DOWN = PROBES_JOBS_DOWN.replace(
    'pages = {name: client.get(f"/delayjobs/{name}/") for name in ("health", "metrics")}',
    'base = "/api/delayjobs/"\n'
    'pages = {"jobs": client.get(f"{base}jobs/"), "queues": client.get(f"{base}queues/"),\n'
    '         "cancel": client.post(f"{base}jobs/{uuid.uuid4()}/cancel/")}',
).replace("import json\n", "import json\nimport uuid\n", 1)


def test_the_api_answers_the_jobs_database_down_in_json_under_atomic_requests(redis_url, tmp_path):
    """The API answers a database it cannot reach with a JSON 503, but with
    ``ATOMIC_REQUESTS`` Django's transaction failed before DRF ran: an HTML 500."""
    assert "cancel" in API_JOBS_DOWN
    for name, (status, kind, body) in run_on_two_databases(API_JOBS_DOWN, redis_url,
                                                           tmp_path).items():  # fmt: skip
        assert (status, kind) == (503, "application/json"), (name, status, body[-3000:])
        assert json.loads(body) == {
            "detail": "The jobs database 'jobs' is unavailable; try again later."
        }


@pytest.mark.django_db(transaction=True)
def test_the_api_still_runs_in_the_request_transaction(admin_user, atomic_requests):
    job = schedule(tasks.record, in_=60, args=["a"])
    in_transaction: list[bool] = []

    def record(execute, sql, params, many, context):
        if not sql.startswith("BEGIN"):  # SQLite's transaction_mode opens it so
            in_transaction.append(connection.in_atomic_block)
        return execute(sql, params, many, context)

    api = client_for(admin_user)
    with connection.execute_wrapper(record):
        assert api.get(url("jobs", job.pk)).status_code == 200
        assert api.post(url("jobs", job.pk, "cancel"), {}, format="json").status_code == 200
    assert in_transaction and all(in_transaction)
