"""A job's history through the API: the latest events in the job's answer, all of them a
page at a time at jobs/<id>/events/. A job retried a thousand times must not make its
answer (nor cancel's, reschedule's, requeue's) a hundred megabytes."""

from __future__ import annotations

import base64
import uuid
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_delayjobs import schedule
from django_delayjobs.models import EventKind, Job, JobEvent
from django_delayjobs.rest.serializers import EMBEDDED_EVENTS
from tests.testapp import tasks

from .test_rest_helpers import client_for, make_user, url

pytestmark = pytest.mark.django_db(transaction=True)

EVENT_FIELDS = {"kind", "at", "attempt", "actor", "message"}


@pytest.fixture
def api():
    return client_for(make_user(superuser=True))


def with_history(n: int) -> Job:
    """A scheduled job whose history holds ``n`` events: its own, then failures 1..n-1."""
    job = schedule(tasks.record, in_=3600, args=["x"])
    JobEvent.objects.bulk_create(
        JobEvent(job=job, kind=EventKind.FAILED, attempt=i, actor="worker:w", message=f"e{i}")
        for i in range(1, n)
    )
    assert job.events.count() == n
    return job


def messages(events: list[dict[str, Any]]) -> list[str]:
    return [event["message"] for event in events]


def all_messages(job: Job) -> list[str]:
    return list(job.events.order_by("id").values_list("message", flat=True))


def test_a_short_history_is_embedded_whole(api):
    job = with_history(3)
    response = api.get(url("jobs", job.pk))
    assert response.status_code == 200
    assert messages(response.data["events"]) == all_messages(job)
    assert response.data["events_omitted"] == 0
    assert set(response.data["events"][0]) == EVENT_FIELDS


def test_a_long_history_embeds_the_latest_events_and_counts_the_rest(api):
    job = with_history(EMBEDDED_EVENTS + 150)
    with CaptureQueriesContext(connection) as queries:
        response = api.get(url("jobs", job.pk))
    assert response.status_code == 200
    events = response.data["events"]
    assert messages(events) == all_messages(job)[-EMBEDDED_EVENTS:]  # oldest first
    assert response.data["events_omitted"] == 150
    assert len(queries.captured_queries) <= 6  # the job, its latest events, one count


def test_exactly_the_limit_omits_nothing(api):
    job = with_history(EMBEDDED_EVENTS)
    response = api.get(url("jobs", job.pk))
    assert len(response.data["events"]) == EMBEDDED_EVENTS
    assert response.data["events_omitted"] == 0


@pytest.mark.parametrize("verb", ["cancel", "reschedule"])
def test_the_answers_of_the_verbs_are_bounded_too(api, verb):
    job = with_history(EMBEDDED_EVENTS + 5)
    body = {"in": 60} if verb == "reschedule" else {}
    response = api.post(url("jobs", job.pk, verb), body, format="json")
    assert response.status_code == 200, response.data
    assert len(response.data["events"]) == EMBEDDED_EVENTS
    assert response.data["events"][-1]["kind"] == {"cancel": "cancelled"}.get(verb, "rescheduled")
    assert response.data["events_omitted"] == 6  # the change added one event


def walk(api, first: str, link: str = "next") -> list[list[str]]:
    pages, next_url = [], first
    while next_url:
        response = api.get(next_url)
        assert response.status_code == 200, response.data
        pages.append(messages(response.data["results"]))
        next_url = response.data[link]
    return pages


def test_the_events_endpoint_walks_every_event_oldest_first(api):
    job = with_history(250)
    first = api.get(url("jobs", job.pk, "events"))
    assert first.status_code == 200
    assert set(first.data) == {"next", "previous", "results"}
    assert first.data["previous"] is None
    assert set(first.data["results"][0]) == EVENT_FIELDS
    pages = walk(api, url("jobs", job.pk, "events"))
    assert [len(page) for page in pages] == [100, 100, 50]
    assert [m for page in pages for m in page] == all_messages(job)
    # and back, from the last page, through the previous links
    last = api.get(url("jobs", job.pk, "events"))
    while last.data["next"]:
        last = api.get(last.data["next"])
    assert walk(api, last.data["previous"], "previous") == pages[-2::-1]


def test_events_written_while_paging_are_neither_repeated_nor_skipped(api):
    job = with_history(30)
    first = api.get(url("jobs", job.pk, "events"), {"page_size": 10})
    job.reschedule(in_=60, actor="api:bob")
    seen = messages(first.data["results"])
    seen += [m for page in walk(api, first.data["next"]) for m in page]
    assert seen == all_messages(job) and len(seen) == 31


def test_the_events_of_one_job_only(api):
    job, other = with_history(3), with_history(4)
    response = api.get(url("jobs", job.pk, "events"))
    assert messages(response.data["results"]) == all_messages(job)
    assert len(api.get(url("jobs", other.pk, "events")).data["results"]) == 4


def cursor(**fields: str) -> str:
    return base64.b64encode(urlencode(fields).encode()).decode()


@pytest.mark.parametrize(
    "params",
    [
        {"page_size": "0"}, {"page_size": "501"}, {"page_size": "ten"}, {"page_size": ""},
        {"page_size": "-1"}, {"page_size": "1e3"}, {"page_size": "٣"},
        {"cursor": "!!!"}, {"cursor": "bm90IGEgY3Vyc29y"},
        {"cursor": cursor(p="abc")}, {"cursor": cursor(p="9" * 40)},
        {"cursor": cursor(p="9" * 5000)}, {"cursor": cursor(p="-5")},
        {"cursor": cursor(p="1.5")}, {"cursor": cursor(p="١٢")}, {"cursor": cursor(o="-1")},
        {"cursor": cursor(r="x", p="1")}, {"cursor": "A" * 5000},
    ],
)  # fmt: skip
def test_hostile_paging_parameters_are_400(api, params):
    job = with_history(3)
    response = api.get(url("jobs", job.pk, "events"), params)
    assert response.status_code == 400, (response.status_code, response.content[:300])
    assert set(response.data) <= {"page_size", "cursor"}


def test_a_crafted_but_valid_position_just_pages_from_there(api):
    job = with_history(5)
    ids = list(job.events.order_by("id").values_list("id", flat=True))
    response = api.get(url("jobs", job.pk, "events"), {"cursor": cursor(p=str(ids[1]))})
    assert response.status_code == 200
    assert messages(response.data["results"]) == all_messages(job)[2:]


def test_links_keep_the_page_size(api):
    job = with_history(5)
    first = api.get(url("jobs", job.pk, "events"), {"page_size": 2})
    query = parse_qs(urlsplit(first.data["next"]).query)
    assert query["page_size"] == ["2"]
    assert messages(api.get(first.data["next"]).data["results"]) == all_messages(job)[2:4]


def test_unknown_and_malformed_job_ids_are_json_404(api):
    assert api.get(url("jobs", uuid.uuid4(), "events")).status_code == 404
    malformed = api.get(url("jobs", "42", "events"))
    assert malformed.status_code == 404 and "UUID" in malformed.data["detail"]


def test_the_events_need_the_same_permission_as_the_job():
    job = with_history(2)
    path = url("jobs", job.pk, "events")
    assert client_for(None).get(path).status_code == 403
    assert client_for(make_user("eve")).get(path).status_code == 403  # staff, no view_job
    viewer = client_for(make_user("vic", perms=("view_job",)))
    assert viewer.get(path).status_code == 200
    assert viewer.post(path, {}, format="json").status_code == 405
