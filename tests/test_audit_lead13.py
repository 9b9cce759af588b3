"""The lead's audit, 2026-12-01 (evening): ``schedule_http``'s body and headers with hostile
values. Real servers: a receiver on 127.0.0.1, a private Redis, the real worker
(``run_delayworker --burst``)."""

from __future__ import annotations

import datetime
import enum
from urllib.parse import urlencode

import pytest

from django_delayjobs import schedule_http
from django_delayjobs.callbacks.policy import Refused
from django_delayjobs.callbacks.request import InvalidCallback
from django_delayjobs.models import Job, Status
from tests.test_audit_sec import allow, burst
from tests.test_rest_helpers import client_for, make_user, url

pytestmark = pytest.mark.django_db(transaction=True)


class NoOffset(datetime.tzinfo):
    """A time zone that cannot say its offset (``tzinfo``'s own ``utcoffset`` raises
    ``NotImplementedError``); ``schedule()`` refuses one in ``args`` (InvalidSchedule)."""


@pytest.mark.parametrize(
    "value",
    [
        datetime.datetime(2030, 1, 1, tzinfo=NoOffset()),
        datetime.time(12, tzinfo=NoOffset()),
        [{"at": datetime.datetime(2030, 1, 1, tzinfo=NoOffset())}],
    ],
    ids=["datetime", "time", "nested"],
)
def test_a_json_body_holding_a_time_zone_that_fails_is_refused_naming_json(
    value, settings, callback_server
):
    """``DjangoJSONEncoder`` asks the tzinfo for its offset: its ``NotImplementedError``
    escaped ``schedule_http``, where only TypeError and ValueError may (docs/callbacks.md:
    "a bad value raises TypeError or a ValueError")."""
    allow(settings, callback_server)
    with pytest.raises(InvalidCallback, match="json= is not JSON") as refused:
        schedule_http(callback_server.url(), in_=0, json={"when": value})
    assert refused.value.field == "json"
    assert not Job.objects.exists()


class Kind(str, enum.Enum):  # noqa: UP042 (not StrEnum: the idiom whose str() is Kind.X)
    REFUND = "refund"


class Level(int, enum.Enum):
    HIGH = 5


class Ratio(float):
    def __str__(self) -> str:
        return "a lot"


def test_a_form_is_sent_with_the_text_of_its_str_int_and_float_subclasses(
    settings, callback_server
):
    """``urlencode`` writes every key and value with ``str()``: a member of ``class
    Kind(str, Enum)`` went as ``Kind.REFUND``, of ``class Level(int, Enum)`` as
    ``Level.HIGH``, where ``json=`` sends ``"refund"`` and ``5``, and where ``args`` and a
    ``queue`` keep the text (docs/scheduling.md). The form is now written from each
    one's base-type value, as the stored and sent body shows."""
    allow(settings, callback_server)
    form = {Kind.REFUND: Level.HIGH, "kind": Kind.REFUND, "ratio": Ratio(0.5), "n": 7, "f": 1.5}
    job = schedule_http(callback_server.url(), in_=0, data=form)
    sent = "refund=5&kind=refund&ratio=0.5&n=7&f=1.5"
    assert Job.objects.get(pk=job.pk).kwargs["body"] == sent
    burst()
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED
    [request] = callback_server.requests
    assert request.body == sent.encode()


def test_a_form_whose_values_are_bools_is_sent_as_before(settings, callback_server):
    """A bool is an int: written as ``str()`` writes it (``True``), as it always was."""
    allow(settings, callback_server)
    job = schedule_http(callback_server.url(), in_=0, data={"a": True, "b": False})
    assert Job.objects.get(pk=job.pk).kwargs["body"] == "a=True&b=False"


class Understated(dict):  # type: ignore[type-arg]
    """A dict that says it holds one entry, whatever it holds."""

    def __len__(self) -> int:
        return 1


def test_headers_that_understate_their_number_are_counted_as_given(settings, callback_server):
    """``check_headers`` took the number from ``len()`` and the headers from ``items()``:
    40 headers that said they were one were stored, and the job died at its first attempt,
    nothing sent ("at most 32 headers, not 40"), a value the door had accepted."""
    allow(settings, callback_server)
    headers = Understated({f"X-Tag-{i}": "v" for i in range(40)})
    with pytest.raises(InvalidCallback) as refused:
        schedule_http(callback_server.url(), in_=0, headers=headers)
    # schedule_http's own message: the stored request's check (check_scheduled) says the
    # same words, then "schedule callbacks with schedule_http", if check_headers miscounts.
    assert str(refused.value) == "at most 32 headers, not 40"
    assert refused.value.field == "headers"
    assert not Job.objects.exists()
    fits = Understated({f"X-Tag-{i}": "v" for i in range(31)})  # with the Content-Type: 32
    job = schedule_http(callback_server.url(), in_=0, json={"a": 1}, headers=fits)
    burst()
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED
    [request] = callback_server.requests
    assert request.headers["x-tag-30"] == "v"


@pytest.mark.parametrize("form", ["multipart", "urlencoded"])
def test_a_json_field_given_in_a_form_and_nested_too_deep_is_a_400(form, settings, callback_server):
    """A form (curl -F, the browsable API) gives ``json`` as text, which DRF's JSONField
    parses itself, past ``SafeJSONParser``: a text nested 100,000 deep raised
    ``RecursionError``, Django's HTML 500 page. Now a 400 naming the field."""
    allow(settings, callback_server)
    api = client_for(make_user(superuser=True))
    deep = "[" * 100_000 + "]" * 100_000
    fields = {"url": callback_server.url(), "in": "0", "json": deep}
    if form == "multipart":
        response = api.post(url("callbacks"), fields, format="multipart")
    else:
        kind = "application/x-www-form-urlencoded"
        response = api.post(url("callbacks"), urlencode(fields), content_type=kind)
    assert response.status_code == 400, response.content[:200]
    assert response.json() == {"json": ["Nested too deeply."]}
    assert not Job.objects.exists()
    fields["json"] = '{"a": [1]}'
    response = api.post(url("callbacks"), fields, format="multipart")
    assert response.status_code == 201, response.content[:200]
    assert Job.objects.get().kwargs["body"] == '{"a":[1]}'


UNSENDABLE = [
    ({"method": "POST", "url": "http://127.0.0.1/", "headers": {"Authorization": "Bearer t0ken-1"}},
     "headers", "carries a credential"),
    ({"method": "TRACE", "url": "http://127.0.0.1/"}, "url", "malformed"),
    ({"method": "POST", "url": "http://user@127.0.0.1/"}, "url", "user information"),
    ({"method": "POST", "url": "http://127.0.0.1/", "body": 5}, "url", "malformed"),
]  # fmt: skip


@pytest.mark.parametrize(("stored", "field", "said"), UNSENDABLE)
def test_the_callback_action_is_scheduled_only_with_a_request_its_delivery_sends(
    stored, field, said, settings, callback_server
):
    """``schedule(deliver, kwargs=...)`` (and ``build_job`` + ``schedule_many``) took any
    kwargs that fit ``deliver(**stored)``: a credential header that "job rows never hold"
    was written to the row, and each such job died at its first attempt, nothing sent."""
    from django_delayjobs import schedule, schedule_many
    from django_delayjobs.callbacks.action import deliver
    from django_delayjobs.services import build_job

    allow(settings, callback_server)
    with pytest.raises(InvalidCallback, match=said) as refused:
        schedule(deliver, in_=0, kwargs=stored)
    assert refused.value.field == field and "schedule_http" in str(refused.value)
    job = build_job(deliver, in_=0, kwargs={"method": "POST", "url": callback_server.url()})
    job.kwargs = stored  # changed after build_job checked it
    with pytest.raises(InvalidCallback, match=said):
        schedule_many([job])
    assert not Job.objects.exists()


def test_the_callback_action_scheduled_with_a_sendable_request_is_sent(settings, callback_server):
    """The other side: a request ``schedule_http`` would store is taken and delivered."""
    from django_delayjobs import schedule, schedule_many
    from django_delayjobs.callbacks.action import deliver
    from django_delayjobs.services import build_job

    allow(settings, callback_server)
    stored = {"method": "PUT", "url": callback_server.url(), "headers": {"X-A": "b"}, "body": "x"}
    one = schedule(deliver, in_=0, kwargs=stored)
    [two] = schedule_many([build_job(deliver, in_=0, kwargs=stored)])
    burst()
    assert {job.status for job in Job.objects.filter(pk__in=[one.pk, two.pk])} == {"succeeded"}
    assert [(r.method, r.body, r.headers["x-a"]) for r in callback_server.requests] == [
        ("PUT", b"x", "b")
    ] * 2


class Modest(str):
    """A str that says it is empty and equal to nothing."""

    def __len__(self) -> int:
        return 0

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = str.__hash__


class LowerCase(str):
    """A header name whose ``lower()`` names a harmless header, whatever it spells."""

    def lower(self) -> str:
        return "x-harmless"


class Short(str):
    """A str that says it has ten characters."""

    def __len__(self) -> int:
        return 10


SUBCLASSED = [
    ({"X-A": Modest("v" * 5000)}, "header X-A: the value must be at most 4096 characters"),
    ({"X-A": Modest("@@@SKIP_HEADER@@@")}, "the HTTP client's own marker"),
    ({LowerCase("Authorization"): "Bearer t0ken-1"}, "header Authorization carries a credential"),
]


@pytest.mark.parametrize(
    ("headers", "said"), SUBCLASSED, ids=["long-value", "skip-marker", "credential-name"]
)
def test_a_header_of_a_str_subclass_is_checked_as_its_text_by_schedule_http_itself(
    headers, said, settings, callback_server
):
    """A subclass's ``len()``, ``==`` and ``lower()`` decided ``check_headers``' checks:
    its text passed ``build`` and was refused only by the stored request's check
    (``check_scheduled``), whose message tells a ``schedule_http`` caller to "schedule
    callbacks with schedule_http". Each is now read as its exact ``str`` first, so
    ``schedule_http`` refuses it with its own message."""
    allow(settings, callback_server)
    with pytest.raises(InvalidCallback, match=said) as refused:
        schedule_http(callback_server.url(), in_=0, headers=headers)
    assert "schedule callbacks with schedule_http" not in str(refused.value)
    assert refused.value.field == "headers"
    assert not Job.objects.exists()


def test_a_url_of_a_str_subclass_is_checked_as_its_text_by_schedule_http_itself(
    settings, callback_server
):
    """A URL of 3,000 characters that says it has ten passed ``parse_url``'s length check
    and was refused only by ``check_scheduled``; now by ``schedule_http``'s own check."""
    allow(settings, callback_server)
    given = Short(callback_server.url() + "?" + "a" * 3000)
    with pytest.raises(Refused) as refused:
        schedule_http(given, in_=0)
    assert str(refused.value) == "the URL must have 1 to 2048 characters"
    assert refused.value.rule == "url"
    assert not Job.objects.exists()


def test_requeue_refuses_a_dead_callback_whose_stored_url_is_refused_saying_why(settings):
    """``check_requeue`` and ``check_scheduled`` read the row through one helper: a stored
    URL refused for its form (``Refused``, not ``InvalidCallback``) escaped the requeue
    bare, without the "would die again ... schedule a new callback" that a refused header
    gets; now both say it."""
    from tests.helpers import planted_callback

    job = planted_callback({"method": "POST", "url": "http://user@127.0.0.1/"}, max_attempts=1)
    burst()
    job.refresh_from_db()
    assert job.status == Status.DEAD
    with pytest.raises(InvalidCallback, match=r"would die again.*user information") as refused:
        job.requeue()
    assert "schedule a new callback" in str(refused.value) and refused.value.field == "url"
    job.refresh_from_db()
    assert job.status == Status.DEAD


def test_the_callback_action_is_scheduled_to_a_host_or_destination_not_allowed_yet(
    settings, callback_server
):
    """The door checks only what the delivery refuses whatever the settings: the allowlist
    and ``HTTP_DESTINATIONS`` may change before the job is due, so a host not in
    ``HTTP_ALLOWED_HOSTS`` and a destination not configured are taken, and the attempt
    refuses them under the settings of its time (nothing sent)."""
    from django_delayjobs import schedule, schedule_many
    from django_delayjobs.callbacks.action import deliver
    from django_delayjobs.services import build_job

    allow(settings, callback_server)  # 127.0.0.1:port only, and no destination
    other_host = {"method": "POST", "url": callback_server.url(host="localhost")}
    no_destination = {"method": "POST", "destination": "billing", "path": "/hook"}
    one = schedule(deliver, in_=0, kwargs=other_host, max_attempts=1)
    two = schedule(deliver, in_=0, kwargs=no_destination, max_attempts=1)
    [three] = schedule_many([build_job(deliver, in_=0, kwargs=other_host, max_attempts=1)])
    burst()
    jobs = Job.objects.filter(pk__in=[one.pk, two.pk, three.pk])
    assert {job.status for job in jobs} == {Status.DEAD}
    assert callback_server.count() == 0
    assert all("refused, nothing sent" in job.last_error for job in jobs)
