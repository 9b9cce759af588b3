"""The admin, second audit: selections larger than a page, long histories, big values."""

from __future__ import annotations

import datetime
import re
import time

import pytest
from django.urls import reverse

from django_delayjobs.connection import SOCKET_TIMEOUT
from django_delayjobs.models import EventKind, Job, JobEvent, Status
from django_delayjobs.services import build_job, schedule_many
from tests.testapp import tasks

from .helpers import confirm_purge
from .test_rest_helpers import dead_job

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "admin:django_delayjobs_job_changelist"


def waiting_jobs(n: int, after: Job) -> list[Job]:
    """``n`` scheduled jobs listed before ``after`` (the list shows the latest due first)."""
    jobs = schedule_many([build_job(tasks.record, in_=3600, args=["x"]) for _ in range(n)])
    later = after.run_at + datetime.timedelta(hours=1)
    Job.objects.filter(pk__in=[job.pk for job in jobs]).update(run_at=later)
    return jobs


# -- purge: the confirmation of a selection larger than what it lists -----------------------


def test_purge_of_a_selection_whose_first_jobs_are_not_dead_offers_its_dead_ones(admin_client):
    """The confirmation read the first 101 selected jobs and listed the dead ones among
    them: with 101 waiting jobs listed first it said "None of the selected jobs is dead"
    and offered no button, though the selection held a dead job."""
    dead = dead_job()
    waiting = waiting_jobs(101, after=dead)
    selection = {"action": "purge_dead", "_selected_action": [str(dead.pk)], "index": "0"}
    response = admin_client.post(reverse(CHANGELIST), {**selection, "select_across": "1"})
    html = response.content.decode()
    assert response.status_code == 200
    assert "nothing to purge" not in html
    assert str(dead.pk) in html and "Yes, purge them" in html
    assert "More than 100 selected jobs are not dead" in html
    confirm_purge(admin_client, reverse(CHANGELIST), {**selection, "select_across": "1"})
    assert not Job.objects.filter(pk=dead.pk).exists()
    alive = Job.objects.filter(pk__in=[job.pk for job in waiting], status=Status.SCHEDULED)
    assert alive.count() == 101


# -- the job page: a long history -----------------------------------------------------------


def test_the_job_page_opens_on_the_latest_events_of_a_long_history(admin_client):
    """Every event was a form of the inline: a job rescheduled 20,000 times (a debounce)
    took 15 s and 7 MB to show, and more would time out. The page shows one page of the
    history, the last (the latest events), and says where it is in it."""
    job = schedule_many([build_job(tasks.record, in_=60, args=["x"])])[0]
    start = job.events.get().at
    JobEvent.objects.bulk_create(
        JobEvent(job=job, kind=EventKind.RESCHEDULED, actor="code", message=f"move {n:05d}",
                 at=start + datetime.timedelta(seconds=n + 1))
        for n in range(249)
    )  # fmt: skip
    response = admin_client.get(reverse("admin:django_delayjobs_job_change", args=[job.pk]))
    html = response.content.decode()
    assert response.status_code == 200
    shown = re.findall(r"move (\d{5})", html)
    assert shown == [f"{n:05d}" for n in range(199, 249)]  # the latest, in order
    assert "Events 201 to 250 of 250" in html
    assert 'href="?history=2#' in html  # the previous page


# -- the queue page: big errors ---------------------------------------------------------------


def test_the_queue_page_shows_a_bounded_part_of_each_dead_jobs_error(admin_client):
    """Each of the 50 listed dead jobs had its whole error on the page: with a 1 MB error
    (an exception's message holding a response body) the page was 50 MB."""
    jobs = [dead_job() for _ in range(3)]
    error = "builtins.ValueError: too big\n" + "x" * 1_000_000 + "\nTHE END"
    Job.objects.filter(pk__in=[job.pk for job in jobs]).update(last_error=error)
    response = admin_client.get(reverse("admin:django_delayjobs_queues"))
    html = response.content.decode()
    assert response.status_code == 200
    assert len(html) < 100_000
    assert html.count("builtins.ValueError: too big") == 6  # the summary and the text
    assert "THE END" not in html
    for job in jobs:
        page = reverse("admin:django_delayjobs_job_change", args=[job.pk])
        assert f'<a href="{page}">the whole error</a>' in html


# -- actions: many refusals -------------------------------------------------------------------


def test_an_action_refused_for_many_jobs_names_a_few_and_counts_the_rest(admin_client):
    """Each refused job had a message of its own: requeueing 100,000 dead jobs whose
    attempts are spent put 100,000 lines (20 MB) into the session and the next page."""
    from django_delayjobs.admin.operations import REFUSALS_NAMED

    jobs = schedule_many([build_job(tasks.record, in_=60, args=["x"]) for _ in range(30)])
    spent = 2**31 - 1  # no attempt may be added
    Job.objects.update(status=Status.DEAD, attempts=spent, max_attempts=spent)
    selection = {"action": "requeue_dead", "_selected_action": [str(jobs[0].pk)], "index": "0"}
    response = admin_client.post(
        reverse(CHANGELIST), {**selection, "select_across": "1"}, follow=True
    )
    messages = [str(m) for m in response.context["messages"]]
    named = [m for m in messages if m.startswith("Job ")]
    assert len(named) == REFUSALS_NAMED
    assert f"{30 - REFUSALS_NAMED} more jobs were not requeued for such reasons." in messages
    assert not Job.objects.exclude(status=Status.DEAD).exists()


# -- actions while Redis does not answer ----------------------------------------------------


@pytest.mark.slow
def test_an_action_while_redis_does_not_answer_waits_for_it_once(admin_client, frozen_redis,
                                                                 settings):  # fmt: skip
    """Each job's Redis call after its commit waited for the read timeout: cancelling a
    page of 100 jobs took 200 s (the web server's timeout cut it short). After one call
    has failed the action leaves the rest to reconcile, as a failed call does."""
    jobs = schedule_many([build_job(tasks.record, in_=600, args=["x"]) for _ in range(10)])
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": frozen_redis}
    selection = {"action": "cancel_jobs", "_selected_action": [str(j.pk) for j in jobs]}
    started = time.monotonic()
    response = admin_client.post(reverse(CHANGELIST), {**selection, "index": "0"}, follow=True)
    took = time.monotonic() - started
    messages = [str(m) for m in response.context["messages"]]
    assert "10 jobs cancelled." in messages
    assert any(m.startswith("Redis did not answer") for m in messages), messages
    assert took < 5 * SOCKET_TIMEOUT, took  # one call's wait, not one (or two) a job
    assert Job.objects.filter(status=Status.CANCELLED).count() == 10
