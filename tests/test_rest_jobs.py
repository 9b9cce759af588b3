"""GET jobs/ and jobs/<id>/: fields, filters, keyset pagination, id validation."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_delayjobs import schedule
from django_delayjobs.models import Job
from django_delayjobs.services import build_job, schedule_many
from tests.testapp import tasks
from tests.testapp.models import Thing

from .test_rest_helpers import client_for, make_user, url

pytestmark = pytest.mark.django_db(transaction=True)

JOB_FIELDS = {
    "id", "queue", "action", "status", "target_type", "target_id", "args", "kwargs", "key",
    "run_at", "expires_at", "attempts", "max_attempts", "priority", "worker", "created_at",
    "started_at", "finished_at", "last_error", "result",
}  # fmt: skip
EVENT_FIELDS = {"kind", "at", "attempt", "actor", "message"}


@pytest.fixture
def api():
    return client_for(make_user(superuser=True))


def ids(response: Any) -> list[str]:
    assert response.status_code == 200, response.data
    return [job["id"] for job in response.data["results"]]


def in_minutes(n: float) -> datetime.datetime:
    return timezone.now() + datetime.timedelta(minutes=n)


def test_list_shows_jobs_latest_due_first_without_counting(api):
    thing = Thing.objects.create()
    soon = schedule(thing.expire, in_=60, kwargs={"reason": "unpaid"}, key="thing-autocancel")
    later = schedule(tasks.record, in_=3600, args=["x"], queue="mail")
    with CaptureQueriesContext(connection) as queries:
        response = api.get(url("jobs"))
    assert ids(response) == [str(later.pk), str(soon.pk)]
    assert response.data["next"] is None and response.data["previous"] is None
    assert not any("COUNT(" in q["sql"].upper() for q in queries.captured_queries)
    first = response.data["results"][1]
    assert set(first) == JOB_FIELDS
    assert first["target_type"] == "testapp.thing" and first["target_id"] == str(thing.pk)
    assert first["action"] == "testapp.Thing.expire" and first["kwargs"] == {"reason": "unpaid"}
    assert first["status"] == "scheduled" and first["key"] == "thing-autocancel"
    assert response.data["results"][0]["target_type"] is None


@pytest.fixture
def assorted():
    """Jobs that differ in one attribute each."""
    thing, other = Thing.objects.create(), Thing.objects.create()
    jobs = {
        "a": schedule(thing.expire, in_=60),
        "b": schedule(other.expire, in_=120, queue="orders", key="k-b"),
        "c": schedule(tasks.record, in_=180, args=["c"], key="k-c"),
        "d": schedule(tasks.record, in_=240, args=["d"], queue="orders"),
    }
    jobs["d"].cancel()
    return {"thing": thing, "other": other, **jobs}


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("status=cancelled", "d"),
        ("status=scheduled", "cba"),
        ("status=cancelled,scheduled", "dcba"),
        ("status=cancelled&status=scheduled", "dcba"),
        ("status=dead", ""),
        ("queue=orders", "db"),
        ("queue=default&status=scheduled", "ca"),
        ("action=tests.testapp.tasks.record", "dc"),
        ("key=k-b", "b"),
        ("target_type=testapp.thing", "ba"),
        ("target_type=testapp.Thing", "ba"),
        ("target_type=testapp.thing&target_id={other}", "b"),
        ("ordering=run_at", "abcd"),
        ("ordering=run_at&queue=orders", "bd"),
    ],
)
def test_filters(api, assorted, query, expected):
    query = query.format(other=assorted["other"].pk)
    assert ids(api.get(url("jobs") + "?" + query)) == [str(assorted[k].pk) for k in expected]


@pytest.mark.parametrize(("query", "expected"), [("k ", "spaced"), ("k", "plain")])
def test_the_key_filter_is_exact_spaces_included(api, query, expected):
    """docs/api.md: `key` filters exactly; DRF's CharField trimmed "k " to "k"."""
    thing = Thing.objects.create()
    jobs = {
        "spaced": schedule(thing.touch, in_=60, key="k "),
        "plain": schedule(thing.expire, in_=60, key="k"),
    }
    assert ids(api.get(url("jobs"), {"key": query})) == [str(jobs[expected].pk)]


@pytest.mark.parametrize("query", [{"queue": "orders "}, {"action": " tests.testapp.tasks.record"}])
def test_the_queue_and_action_filters_are_exact_too(api, assorted, query):
    assert ids(api.get(url("jobs"), query)) == []


def test_action_names_match_what_schedule_stored(assorted):
    # the parametrized action filter above relies on this name
    assert assorted["c"].action == "tests.testapp.tasks.record"


def test_run_at_range_is_half_open(api, assorted):
    b_at = assorted["b"].run_at.isoformat()
    c_at = assorted["c"].run_at.isoformat()
    got = ids(api.get(url("jobs"), {"run_at_after": b_at, "run_at_before": c_at}))
    assert got == [str(assorted["b"].pk)]
    got = ids(api.get(url("jobs"), {"run_at_after": b_at}))
    assert got == [str(assorted[k].pk) for k in "dcb"]
    # another offset, the same instant
    plus_two = assorted["c"].run_at.astimezone(datetime.timezone(datetime.timedelta(hours=2)))
    got = ids(api.get(url("jobs"), {"run_at_before": plus_two.isoformat()}))
    assert got == [str(assorted[k].pk) for k in "ba"]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"status": "paused"}, "status"),
        ({"status": ","}, "status"),
        ({"target_type": "nope.model"}, "target_type"),
        ({"target_type": "testapp"}, "target_type"),
        ({"target_id": "1"}, "target_id"),
        ({"run_at_after": "2030-01-01T09:00:00"}, "run_at_after"),
        ({"run_at_before": "2030-01-01"}, "run_at_before"),
        ({"run_at_after": "tomorrow"}, "run_at_after"),
        ({"run_at_after": "2030-01-02T00:00:00Z", "run_at_before": "2030-01-01T00:00:00Z"},
         "run_at_before"),
        ({"ordering": "created_at"}, "ordering"),
        ({"stauts": "dead"}, "stauts"),
        ({"page_size": "0"}, "page_size"),
        ({"page_size": "501"}, "page_size"),
        ({"page_size": "ten"}, "page_size"),
        ({"page_size": "٣"}, "page_size"),
        ({"page_size": " 5"}, "page_size"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"cursor": "WyIyMDMwLTAxLTAxVDAwOjAwOjAwIiwgIngiLCAwXQ"}, "cursor"),
    ],
)  # fmt: skip
def test_bad_query_parameters_are_400_with_the_field(api, params, field):
    response = api.get(url("jobs"), params)
    assert response.status_code == 400
    assert list(response.data) == [field]


def test_naive_datetime_error_says_what_to_do(api):
    response = api.get(url("jobs"), {"run_at_after": "2030-01-01T09:00:00"})
    assert "time zone" in str(response.data["run_at_after"][0])


@pytest.fixture
def tied():
    """Nine jobs: seven due at the very same instant (schedule_many with at=), two others."""
    at = in_minutes(30)
    jobs = [build_job(tasks.record, at=at, args=[str(i)]) for i in range(7)]
    jobs += [build_job(tasks.record, in_=60, args=["early"]),
             build_job(tasks.record, in_=7200, args=["late"])]  # fmt: skip
    schedule_many(jobs)
    return jobs


def walk(api, first: str, link: str) -> list[list[str]]:
    pages, next_url = [], first
    while next_url:
        response = api.get(next_url)
        pages.append(ids(response))
        next_url = response.data[link]
    return pages


@pytest.mark.parametrize("ordering", ["-run_at", "run_at"])
def test_pagination_walks_ties_forwards_and_backwards(api, tied, ordering):
    # The order the database gives for the same ORDER BY, ties broken by id.
    order = ("run_at", "id") if ordering == "run_at" else ("-run_at", "-id")
    expected = [str(pk) for pk in Job.objects.order_by(*order).values_list("pk", flat=True)]
    forwards = walk(api, url("jobs") + f"?page_size=2&ordering={ordering}", "next")
    assert [len(p) for p in forwards] == [2, 2, 2, 2, 1]
    assert [i for page in forwards for i in page] == expected
    # from the last page back to the first, through the previous links
    last = api.get(url("jobs") + f"?page_size=2&ordering={ordering}")
    while last.data["next"]:
        last = api.get(last.data["next"])
    backwards = walk(api, last.data["previous"], "previous")
    assert backwards == forwards[-2::-1]


def test_a_job_added_while_paging_is_neither_repeated_nor_skipping_others(api, tied):
    first = api.get(url("jobs") + "?page_size=4")
    schedule(tasks.record, in_=1, args=["new"])  # sorts after the first page
    seen = ids(first) + [i for page in walk(api, first.data["next"], "next") for i in page]
    assert len(seen) == len(set(seen)) == len(tied) + 1


def test_detail_has_the_events(api):
    job = schedule(tasks.record, in_=60, args=["x"])
    job.reschedule(in_=120, actor="admin:bob")
    response = api.get(url("jobs", job.pk))
    assert response.status_code == 200
    assert set(response.data) == JOB_FIELDS | {"events", "events_omitted"}
    assert [(e["kind"], e["actor"]) for e in response.data["events"]] == [
        ("scheduled", "code"), ("rescheduled", "admin:bob"),
    ]  # fmt: skip
    assert set(response.data["events"][0]) == EVENT_FIELDS


def test_unknown_and_malformed_ids_are_json_404(api):
    missing = api.get(url("jobs", uuid.uuid4()))
    assert missing.status_code == 404 and missing["Content-Type"] == "application/json"
    malformed = api.get(url("jobs", "42"))
    assert malformed.status_code == 404 and "UUID" in malformed.data["detail"]
    assert api.get(url("jobs", "0b9d6c2e-5f1a")).status_code == 404


def test_write_verbs_are_not_allowed_on_collections(api):
    assert api.post(url("jobs"), {}, format="json").status_code == 405
    job = schedule(tasks.record, in_=60, args=["x"])
    assert api.delete(url("jobs", job.pk)).status_code == 405
    assert api.get(url("jobs", job.pk, "cancel")).status_code == 405
