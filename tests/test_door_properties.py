"""The door as a property: every input to ``schedule()``, hostile ones included, is either
refused with TypeError/ValueError and nothing written, or accepted, read back equal, run,
and shown by the admin (list and page) and the API (list and detail) with 200 (issue 13).

Read back equal, with the normalisations docs/scheduling.md names: an aware datetime
comes back as the same instant (in UTC, or a fixed offset in args), ``-0.0`` may come
back as ``0.0``. Run: a job due later is moved to now; the in-process worker
(``run_delayworker --burst``) then runs it with exactly the arguments given, or skips
it if its expiry has passed.

``DOOR_EXAMPLES`` sets how many inputs are tried (default 60: about 20 s per database).
"""

from __future__ import annotations

import datetime
import math
import os
import uuid
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from django_delayjobs import schedule
from django_delayjobs.exceptions import InvalidSchedule, NotDelayable
from django_delayjobs.models import Job, JobEvent, Status
from django_delayjobs.serialization import load, same_time
from tests.testapp import tasks

from .test_rest_helpers import burst, client_for, make_user, url

pytestmark = pytest.mark.django_db(transaction=True)

settings.register_profile(
    "door",
    max_examples=int(os.environ.get("DOOR_EXAMPLES", "60")),
    deadline=None,  # each example runs a worker and renders four pages
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
    database=None,  # the examples write rows: no replay of stale ones between runs
)

UTC = datetime.UTC
LIMIT = datetime.timedelta(hours=23, minutes=59, seconds=59, microseconds=999_999)
CENTURY = datetime.timedelta(days=36500)


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


offsets = st.timedeltas(min_value=-LIMIT, max_value=LIMIT).map(datetime.timezone)
zones = st.one_of(st.timezones(), offsets, st.just(UTC))
any_datetime = st.datetimes(datetime.datetime.min, datetime.datetime.max, timezones=zones)
extremes = st.sampled_from([datetime.datetime.min, datetime.datetime.max]).flatmap(
    lambda dt: offsets.map(lambda tz: dt.replace(tzinfo=tz))
)
seconds_around_now = st.floats(-150 * 365 * 86400.0, 150 * 365 * 86400.0)
near_now = st.builds(
    lambda s, tz: (timezone.now() + datetime.timedelta(seconds=s)).astimezone(tz),
    seconds_around_now, zones,
)  # fmt: skip
ats = st.one_of(near_now, any_datetime, extremes, st.datetimes())  # the last ones naive

huge_ints = st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 10**400, -(10**400)])
delays = st.one_of(
    st.floats(0, 3600), st.floats(allow_nan=True, allow_infinity=True), st.integers(0, 10**6),
    st.integers(), huge_ints, st.timedeltas(), st.timedeltas(max_value=CENTURY * 2),
    st.sampled_from([True, "10", None]),
)  # fmt: skip

texts = st.one_of(
    st.text(st.characters(exclude_categories=()), max_size=12),  # NUL and surrogates too
    st.sampled_from(["\x00", "\ud800", "a\udfffb", "k" * 300, ""]),
)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), huge_ints, st.floats(), texts,
    st.datetimes(timezones=st.none() | zones), st.dates(), st.decimals(), st.uuids(),
)  # fmt: skip


def json_like(leaves: Any, keys: Any, depths: Any) -> Any:
    """Lists and dicts of ``leaves`` (dict keys from ``keys``), or plain nests ``depths`` deep."""
    return st.one_of(
        st.recursive(
            leaves,
            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
            max_leaves=8,
        ),
        depths.map(nested),
    )


values = json_like(scalars, texts, st.integers(20, 40))  # around the nesting limit (32)

# Inputs the door should take, at its edges: any Unicode text but NUL and surrogates,
# 64-bit ints, floats below 1e16, datetimes of any year in args, nesting up to 32 levels,
# due times from 1970 to 100 years ahead.
fair_texts = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"))
fair_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
    st.floats(-9.999999999999998e15, 9.999999999999998e15), fair_texts,
    st.datetimes(), st.datetimes(timezones=st.timezones()), st.dates(),
    st.decimals(allow_nan=False), st.uuids(),
)  # fmt: skip
fair_values = json_like(fair_scalars, fair_texts, st.integers(1, 31))
fair_ats = st.floats(-56 * 365 * 86400.0, 99 * 365 * 86400.0).flatmap(
    lambda s: zones.map(lambda tz: (timezone.now() + datetime.timedelta(seconds=s)).astimezone(tz))
)


def call_strategy(args: Any, texts_: Any, when: Any, delays_: Any, key: Any) -> Any:
    return st.fixed_dictionaries(
        {"args": st.lists(args, max_size=3), "kwargs": st.dictionaries(texts_, args, max_size=2)},
        optional={
            "key": key,
            "max_attempts": st.one_of(st.integers(-2, 5), huge_ints, st.just(2**31 - 1)),
            "priority": st.one_of(st.integers(-101, 101), huge_ints),
            "queue": st.sampled_from(["default", "a:b", "x" * 65]),
            "expires": st.one_of(delays_, when),
        },
    ).flatmap(
        lambda call: st.one_of(
            st.builds(lambda in_: {**call, "in_": in_}, delays_),
            st.builds(lambda at: {**call, "at": at}, when),
        )
    )


calls = st.one_of(
    call_strategy(values, texts, ats, delays, st.one_of(texts, st.text(max_size=300))),
    call_strategy(
        fair_values,
        fair_texts,
        fair_ats,
        st.floats(0, 3600) | st.integers(0, 10**6),
        st.text(
            st.characters(exclude_categories=("Cs",), exclude_characters="\x00"),
            min_size=1,
            max_size=255,
        ),
    ),
)


def same(a: Any, b: Any) -> bool:
    """``a`` read back is ``b`` as given, with the documented normalisations."""
    if isinstance(b, tuple | list):
        return type(a) is list and len(a) == len(b) and all(map(same, a, b))
    if isinstance(b, dict):
        return type(a) is dict and a.keys() == b.keys() and all(same(a[k], b[k]) for k in b)
    if isinstance(b, datetime.datetime):
        return type(a) is datetime.datetime and same_time(a, b)
    if isinstance(b, float):
        return type(a) is float and (a == b or (math.isnan(a) and math.isnan(b)))
    return type(a) is type(b) and a == b


@pytest.fixture
def clients(client):
    user = make_user("prop", superuser=True)
    client.force_login(user)
    return client, client_for(user)


@settings(settings.get_profile("door"))
@given(call=calls)
def test_every_input_is_refused_cleanly_or_stored_read_back_run_and_shown(
    clients, redis_client, call
):
    counts = (Job.objects.count(), JobEvent.objects.count())
    before = timezone.now()
    try:
        job = schedule(tasks.keep, **call)
    except (TypeError, ValueError) as exc:
        refused: Exception | None = exc
    else:
        refused = None
    if refused is not None:
        event(f"refused: {type(refused).__name__}")
        assert type(refused) in (TypeError, InvalidSchedule, NotDelayable), repr(refused)
        assert (Job.objects.count(), JobEvent.objects.count()) == counts
        return
    event("accepted")
    after = timezone.now()
    row = Job.objects.get(pk=job.pk)
    assert_read_back(row, call, before, after)
    assert_shown(clients, row)
    assert_run(row, call)


def assert_read_back(row: Job, call: dict[str, Any], before: Any, after: Any) -> None:
    assert same(load(row.args), call["args"]), (load(row.args), call["args"])
    assert same(load(row.kwargs), call["kwargs"])
    assert row.key == call.get("key")
    if "at" in call:
        assert same_time(row.run_at, call["at"])
    else:
        delay = call["in_"]
        delay = (
            delay if isinstance(delay, datetime.timedelta) else datetime.timedelta(seconds=delay)
        )
        assert before + delay - datetime.timedelta(microseconds=1) <= row.run_at
        assert row.run_at <= after + delay + datetime.timedelta(microseconds=1)
    expires = call.get("expires")
    if isinstance(expires, datetime.datetime):
        assert same_time(row.expires_at, expires)
    elif expires is not None:
        assert row.expires_at > row.run_at
    for when in (row.run_at, row.expires_at):
        assert when is None or datetime.datetime(1970, 1, 1, tzinfo=UTC) <= when


def assert_shown(clients: Any, row: Job) -> None:
    admin, api = clients
    window = {
        "run_at_after": row.run_at.isoformat(),
        "run_at_before": (row.run_at + datetime.timedelta(microseconds=1)).isoformat(),
    }
    pages = {
        "admin list": admin.get(reverse("admin:django_delayjobs_job_changelist"), {"q": row.pk}),
        "admin page": admin.get(reverse("admin:django_delayjobs_job_change", args=[row.pk])),
        "api list": api.get(url("jobs"), window),
        "api detail": api.get(url("jobs", row.pk)),
    }
    for name, response in pages.items():
        assert response.status_code == 200, (name, response.content[:300])
    assert str(row.pk)[-8:] in pages["admin list"].content.decode()
    assert str(row.pk) in [job["id"] for job in pages["api list"].json()["results"]]
    assert pages["api detail"].json()["key"] == row.key


def assert_run(row: Job, call: dict[str, Any]) -> None:
    if row.run_at > timezone.now():
        assert row.reschedule(in_=0)
    tasks.kept.clear()
    burst()
    row.refresh_from_db()
    if row.expires_at is not None and row.expires_at <= row.run_at:
        pytest.fail("the door let an expiry before the due time in")
    if row.status == Status.SKIPPED:
        assert row.expires_at is not None and row.expires_at <= timezone.now()
        return
    assert row.status == Status.SUCCEEDED, (row.status, row.last_error)
    ((args, kwargs),) = tasks.kept
    assert same(list(args), call["args"]) and same(kwargs, call["kwargs"])


def test_the_strategies_reach_both_sides_of_the_door():
    """The property is only worth something if many inputs pass and many are refused."""
    outcomes: set[str] = set()

    @settings(max_examples=300, database=None, deadline=None)
    @given(call=calls)
    def probe(call: dict[str, Any]) -> None:
        from django_delayjobs.services import build_job

        try:
            build_job(tasks.keep, **call)
        except (TypeError, ValueError) as exc:
            outcomes.add(type(exc).__name__)
        else:
            outcomes.add("accepted")

    probe()
    assert {"accepted", "TypeError", "InvalidSchedule"} <= outcomes


def test_uuid_and_decimal_values_round_trip(clients):  # a fixed example of the property
    values = [uuid.UUID(int=1), Decimal("-0.000"), Decimal("Infinity"), -0.0, 5e-324]
    job = schedule(tasks.keep, in_=0, args=values)
    assert same(load(Job.objects.get(pk=job.pk).args), values)
    assert_shown(clients, Job.objects.get(pk=job.pk))


EDGE = [
    "\uffff\ufffe", "\u202eevil\u202c", "\U0010ffff", "x" * 100_000, "", " ",
    2**63 - 1, -(2**63), 5e-324, 9.999999999999998e15, 1e-300, 0.30000000000000004,
    Decimal("1e999999"), Decimal("9" * 10000), Decimal("1." + "0" * 5000 + "1"),
    datetime.datetime(1, 1, 1, tzinfo=UTC),
    datetime.datetime(1, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=5))),
    datetime.datetime(9999, 12, 31, 23, 59, 59, 999999,
                      tzinfo=datetime.timezone(datetime.timedelta(hours=-5))),
    datetime.datetime(2030, 11, 3, 1, 30, fold=1, tzinfo=ZoneInfo("America/New_York")),
    datetime.datetime(2030, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(seconds=30))),
    datetime.datetime.min, datetime.datetime.max, datetime.date(1, 1, 1),
    uuid.UUID(int=2**128 - 1), {"$dt": 1, "x": 2}, {"$dtx": "a"}, {"": None},
]  # fmt: skip


@pytest.mark.parametrize("key", ["k" * 255, "\u202e" + "\U0001f600" * 254, " k ", "\uffff"])
def test_edge_values_round_trip_run_and_show(clients, key):  # fixed examples of the property
    admin, _ = clients
    kwargs = {"k\uffff": EDGE[:5], "d": {"n": EDGE}}
    queue = "Q.-_" * 16  # 64 characters
    job = schedule(tasks.keep, in_=0, args=EDGE, kwargs=kwargs, key=key, queue=queue,
                   priority=-100, max_attempts=2**31 - 1, actor="a\u202e" * 75,
                   expires=datetime.timedelta(days=36499))  # fmt: skip
    row = Job.objects.get(pk=job.pk)
    assert same(load(row.args), EDGE) and same(load(row.kwargs), kwargs)
    assert (row.key, row.queue) == (key, queue)
    assert_shown(clients, row)
    assert admin.get(reverse("admin:django_delayjobs_queues")).status_code == 200
    tasks.kept.clear()
    call_command("run_delayworker", "--burst", "-v", "0", "--queues", queue)
    row.refresh_from_db()
    assert row.status == Status.SUCCEEDED, row.last_error
    ((args, got),) = tasks.kept
    assert same(list(args), EDGE) and same(got, kwargs)
    assert_shown(clients, row)
