"""The door: every value that cannot be stored and read back faithfully on SQLite and
PostgreSQL is refused by schedule(), reschedule(), build_job/schedule_many and the API
before anything is written, with TypeError or InvalidSchedule (a ValueError) and a
message that says what to do. Never a bare OverflowError, RecursionError, DataError or
UnicodeEncodeError (findings 1, 2 and 4 of issue 13)."""

from __future__ import annotations

import datetime
from decimal import Decimal

import pytest
from django.contrib.contenttypes.models import ContentType
from django.db import DatabaseError
from django.utils import timezone

from django_delayjobs import schedule, schedule_many
from django_delayjobs.exceptions import InvalidSchedule
from django_delayjobs.models import Job, JobEvent, Status
from django_delayjobs.serialization import load
from django_delayjobs.services import build_job, requeue
from tests.testapp import tasks
from tests.testapp.models import Sku, SpecialThing, Thing

from .test_rest_helpers import client_for, dead_job, make_user, snapshot, url

pytestmark = pytest.mark.django_db(transaction=True)

UTC = datetime.UTC
MINUS_5 = datetime.timezone(datetime.timedelta(hours=-5))
PLUS_5 = datetime.timezone(datetime.timedelta(hours=5))
CENTURY = datetime.timedelta(days=36500)


class NoOffset(datetime.tzinfo):
    """A tzinfo subclass that forgot utcoffset() (the base class raises NotImplementedError)."""

    def tzname(self, dt):
        return "XYZ"


NO_OFFSET = datetime.datetime(2030, 1, 1, tzinfo=NoOffset())
#: The nesting limit docs/scheduling.md promises (lists and dicts, args itself included).
MAX_DEPTH = 32
#: MAX_JSON_BYTES's default: args and kwargs together, as json.dumps writes them.
MIB = 1 << 20


@pytest.fixture
def thing():
    return Thing.objects.create(name="t")


def nested(depth: int) -> list[object]:
    """A list ``depth`` lists deep (built without recursion, so any depth is cheap)."""
    value: list[object] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def refused(call, thing, redis_client, match: str) -> Exception:
    """``call(thing)`` raises TypeError or InvalidSchedule naming ``match``; nothing written."""
    with pytest.raises((TypeError, InvalidSchedule)) as info:
        call(thing)
    assert not isinstance(info.value, OverflowError | RecursionError | DatabaseError)
    assert not isinstance(info.value, UnicodeError)
    assert type(info.value) in (TypeError, InvalidSchedule), repr(info.value)
    assert match in str(info.value), str(info.value)
    assert not Job.objects.exists()
    assert not JobEvent.objects.exists()
    assert redis_client.dbsize() == 0
    return info.value


def far() -> datetime.datetime:
    return timezone.now() + CENTURY + datetime.timedelta(days=1)


HOSTILE = [
    # due times: before 1970, more than 100 years ahead, at the datetime limits
    ("at 1969", lambda t: schedule(t.touch, at=datetime.datetime(1969, 12, 31, tzinfo=UTC)),
     "1970"),
    ("at 1960 +05:00", lambda t: schedule(t.touch, at=datetime.datetime(1960, 1, 1, tzinfo=PLUS_5)),
     "1970"),
    ("at 9999", lambda t: schedule(t.touch, at=datetime.datetime(9999, 12, 31, tzinfo=UTC)),
     "100 years"),
    ("at 101 years", lambda t: schedule(t.touch, at=far()), "100 years"),
    ("at max -05:00", lambda t: schedule(t.touch, at=datetime.datetime.max.replace(tzinfo=MINUS_5)),
     "100 years"),
    ("at min +05:00", lambda t: schedule(t.touch, at=datetime.datetime.min.replace(tzinfo=PLUS_5)),
     "1970"),
    ("at max UTC", lambda t: schedule(t.touch, at=datetime.datetime.max.replace(tzinfo=UTC)),
     "100 years"),
    ("at a tzinfo without utcoffset", lambda t: schedule(t.touch, at=NO_OFFSET), "time zone"),
    # delays: overflowing, infinite, huge timedeltas
    ("in 10**400", lambda t: schedule(t.touch, in_=10**400), "100 years"),
    ("in -10**400", lambda t: schedule(t.touch, in_=-(10**400)), "non-negative"),
    ("in inf", lambda t: schedule(t.touch, in_=float("inf")), "finite"),
    ("in timedelta.max", lambda t: schedule(t.touch, in_=datetime.timedelta.max), "100 years"),
    ("in timedelta.min", lambda t: schedule(t.touch, in_=datetime.timedelta.min), "non-negative"),
    ("in 101 years", lambda t: schedule(t.touch, in_=CENTURY + datetime.timedelta(days=1)),
     "100 years"),
    # expiries: the same bounds
    ("expires 10**400", lambda t: schedule(t.touch, in_=1, expires=10**400), "100 years"),
    ("expires inf", lambda t: schedule(t.touch, in_=1, expires=float("inf")), "finite"),
    ("expires timedelta.max", lambda t: schedule(t.touch, in_=1, expires=datetime.timedelta.max),
     "100 years"),
    ("expires past a century", lambda t: schedule(t.touch, in_=CENTURY - datetime.timedelta(days=1),
                                                  expires=datetime.timedelta(days=2)),
     "100 years"),
    ("expires at 9999", lambda t: schedule(t.touch, in_=1,
                                           expires=datetime.datetime(9999, 1, 1, tzinfo=UTC)),
     "100 years"),
    ("expires at max -05:00",
     lambda t: schedule(t.touch, in_=1, expires=datetime.datetime.max.replace(tzinfo=MINUS_5)),
     "100 years"),
    ("expires a tzinfo without utcoffset", lambda t: schedule(t.touch, in_=1, expires=NO_OFFSET),
     "time zone"),
    # strings that no database stores faithfully: lone surrogates and NUL
    ("surrogate in args", lambda t: schedule(tasks.echo, in_=1, args=["\ud800"]), "surrogate"),
    ("NUL in args", lambda t: schedule(tasks.echo, in_=1, args=["a\x00b"]), "NUL"),
    ("surrogate deep in args", lambda t: schedule(tasks.echo, in_=1, args=[{"a": ["x\udfff"]}]),
     "surrogate"),
    ("surrogate in a kwargs key", lambda t: schedule(tasks.echo, in_=1, kwargs={"\ud800": 1}),
     "surrogate"),
    ("NUL in a nested key", lambda t: schedule(tasks.echo, in_=1, args=[{"a\x00": 1}]), "NUL"),
    ("NUL in kwargs", lambda t: schedule(tasks.echo, in_=1, kwargs={"a": "\x00"}), "NUL"),
    ("surrogate in key", lambda t: schedule(t.touch, in_=1, key="k\ud800"), "surrogate"),
    ("NUL in key", lambda t: schedule(t.touch, in_=1, key="k\x00"), "NUL"),
    ("key too long", lambda t: schedule(t.touch, in_=1, key="k" * 256), "255"),
    ("NUL in actor", lambda t: schedule(t.touch, in_=1, actor="a\x00"), "NUL"),
    ("actor too long", lambda t: schedule(t.touch, in_=1, actor="a" * 151), "150"),
    # nesting deeper than the documented limit, at the limit + 1 and far beyond it
    ("nesting limit + 1", lambda t: schedule(tasks.echo, in_=1, args=nested(MAX_DEPTH + 1)),
     "deep"),
    ("nesting 100k", lambda t: schedule(tasks.echo, in_=1, args=nested(100_000)), "deep"),
    ("self-referential", lambda t: schedule(tasks.echo, in_=1, args=[_loop()]), "deep"),
    # size: args and kwargs together, at the limit + 1 and beyond what jsonb holds (255 MB)
    ("args 1 MiB + 1", lambda t: schedule(tasks.echo, in_=1, args=["x" * (MIB - 5)]),
     "MAX_JSON_BYTES"),
    ("args + kwargs 1 MiB + 1", lambda t: schedule(
        tasks.echo, in_=1, args=["x" * (MIB // 2)], kwargs={"k": "x" * (MIB // 2 - 12)}),
     "MAX_JSON_BYTES"),
    ("args 300 MB", lambda t: schedule(tasks.echo, in_=1, args=["x" * 300_000_000]),
     "MAX_JSON_BYTES"),
    # numbers: beyond 64 bits, beyond int-to-str conversion, floats PostgreSQL turns into ints
    ("int 2**63", lambda t: schedule(tasks.echo, in_=1, args=[2**63]), "64"),
    ("int -2**63 - 1", lambda t: schedule(tasks.echo, in_=1, args=[-(2**63) - 1]), "64"),
    ("int 10**5000", lambda t: schedule(tasks.echo, in_=1, kwargs={"n": 10**5000}), "64"),
    ("float 1e16", lambda t: schedule(tasks.echo, in_=1, args=[1e16]), "Decimal"),
    ("float -1e300", lambda t: schedule(tasks.echo, in_=1, args=[-1e300]), "Decimal"),
    ("Decimal NaN", lambda t: schedule(tasks.echo, in_=1, args=[Decimal("NaN")]), "NaN"),
    ("Decimal sNaN", lambda t: schedule(tasks.echo, in_=1, args=[Decimal("sNaN")]), "NaN"),
    ("datetime offset in us",
     lambda t: schedule(tasks.echo, in_=1, args=[datetime.datetime(
         2030, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(microseconds=1)))]),
     "offset"),
    ("datetime a tzinfo without utcoffset",
     lambda t: schedule(tasks.echo, in_=1, args=[NO_OFFSET]), "time zone"),
    # columns: max_attempts beyond a 32-bit integer column, target ids beyond 64 characters
    ("max_attempts 2**31", lambda t: schedule(t.touch, in_=1, max_attempts=2**31), "2147483647"),
    ("max_attempts 10**400", lambda t: schedule(t.touch, in_=1, max_attempts=10**400),
     "2147483647"),
    ("queue", lambda t: schedule(t.touch, in_=1, queue="a:b"), "queue"),
    # priority: a small int column with a range
    ("priority 101", lambda t: schedule(t.touch, in_=1, priority=101), "-100 to 100"),
    ("priority -2**15", lambda t: schedule(t.touch, in_=1, priority=-(2**15)), "-100 to 100"),
    ("priority 10**400", lambda t: schedule(t.touch, in_=1, priority=10**400), "-100 to 100"),
    # more digits than str() writes (4,300): the message must not format them
    ("priority 10**5000", lambda t: schedule(t.touch, in_=1, priority=10**5000), "-100 to 100"),
    ("priority -10**5000", lambda t: schedule(t.touch, in_=1, priority=-(10**5000)),
     "-100 to 100"),
    ("max_attempts -10**5000", lambda t: schedule(t.touch, in_=1, max_attempts=-(10**5000)),
     "at least 1"),
    ("priority float", lambda t: schedule(t.touch, in_=1, priority=1.0), "int"),
    ("priority bool", lambda t: schedule(t.touch, in_=1, priority=True), "int"),
    ("priority str", lambda t: schedule(t.touch, in_=1, priority="5"), "int"),
    ("priority None", lambda t: schedule(t.touch, in_=1, priority=None), "int"),
]  # fmt: skip


def _loop() -> list[object]:
    loop: list[object] = []
    loop.append(loop)
    return loop


@pytest.mark.parametrize(("call", "match"), [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_schedule_refuses_what_cannot_be_stored_and_read_back(thing, redis_client, call, match):
    refused(call, thing, redis_client, match)


def test_value_problems_are_invalid_schedule_and_say_what_to_do(thing, redis_client):
    error = refused(lambda t: schedule(t.touch, in_=10**400), thing, redis_client, "100 years")
    assert isinstance(error, InvalidSchedule) and isinstance(error, ValueError)
    error = refused(lambda t: schedule(tasks.echo, in_=1, args=[2**64]), thing, redis_client, "64")
    assert "str or Decimal" in str(error)
    error = refused(lambda t: schedule(t.touch, at=datetime.datetime(1900, 1, 1, tzinfo=UTC)),
                    thing, redis_client, "1970")  # fmt: skip
    assert "past" in str(error)  # a due time in the past is fine: it says so


def test_a_target_whose_pk_does_not_fit_the_column_is_refused(thing, redis_client):
    thing.pk = "x" * 65  # a CharField primary key longer than Job.target_id holds
    refused(lambda t: schedule(t.touch, in_=1), thing, redis_client, "64")


def test_the_limits_themselves_are_accepted_and_read_back(thing):
    now = timezone.now()
    edge = [
        2**63 - 1, -(2**63), 9.999999999999998e15, -9.999999999999998e15, 5e-324, -0.0,
        "\U0001f600 \u00e9 \ufffd", {"k" * 1000: nested(MAX_DEPTH - 2)},
        Decimal("1e999999"), Decimal("-Infinity"),
    ]  # fmt: skip
    job = schedule(tasks.echo, at=datetime.datetime(1970, 1, 1, tzinfo=UTC), args=edge,
                   key="k" * 255, max_attempts=2**31 - 1)  # fmt: skip
    row = Job.objects.get(pk=job.pk)
    assert load(row.args) == edge
    assert row.run_at == datetime.datetime(1970, 1, 1, tzinfo=UTC)
    assert row.key == "k" * 255 and row.max_attempts == 2**31 - 1
    late = schedule(thing.touch, at=now + CENTURY - datetime.timedelta(minutes=1))
    assert Job.objects.get(pk=late.pk).run_at == late.run_at


def test_the_size_limit_counts_bytes_as_json_dumps_writes_them(settings, redis_client):
    """At MAX_JSON_BYTES a job is stored and read back; one byte more is refused. The size
    is what Django sends the database: json.dumps of args plus json.dumps of kwargs."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "MAX_JSON_BYTES": 1024}
    frame = len('["", ""]') + len('{"k": ""}')  # 8 + 9
    fits = ["\u00e9" * 10, "x" * (1024 - frame - 60)]  # each é is written \u00e9: 6 bytes
    job = schedule(tasks.echo, in_=1, args=fits, kwargs={"k": ""})
    assert load(Job.objects.get(pk=job.pk).args) == fits
    with pytest.raises(InvalidSchedule, match=r"1,025 bytes .* allows 1,024"):
        schedule(tasks.echo, in_=1, args=[fits[0], fits[1] + "x"], kwargs={"k": ""})
    assert Job.objects.count() == 1


def test_reschedule_refuses_the_same_values(thing, redis_client):
    job = schedule(thing.touch, in_=60)
    before = snapshot(job)
    for when, match in [
        ({"at": datetime.datetime(1969, 7, 20, tzinfo=UTC)}, "1970"),
        ({"at": datetime.datetime(9999, 12, 31, 23, 59, tzinfo=UTC)}, "100 years"),
        ({"at": datetime.datetime.max.replace(tzinfo=MINUS_5)}, "100 years"),
        ({"at": datetime.datetime.min.replace(tzinfo=PLUS_5)}, "1970"),
        ({"in_": 10**400}, "100 years"),
        ({"in_": datetime.timedelta.max}, "100 years"),
        ({"at": NO_OFFSET}, "time zone"),
    ]:
        with pytest.raises(InvalidSchedule, match=match):
            job.reschedule(**when)
    with pytest.raises(InvalidSchedule, match="NUL"):
        job.reschedule(in_=5, actor="\x00")
    with pytest.raises(InvalidSchedule, match="surrogate"):
        job.cancel(actor="admin:\ud800")
    assert snapshot(job) == before


def test_requeue_refuses_attempts_too_long_to_print():
    """requeue(attempts=-10**5000): InvalidSchedule, not the bare ValueError str() raises
    for an int of more than 4,300 digits."""
    job = dead_job()
    with pytest.raises(InvalidSchedule, match="at least 1") as info:
        requeue(job, attempts=-(10**5000))
    assert type(info.value) is InvalidSchedule
    assert Job.objects.get(pk=job.pk).status == Status.DEAD


def test_build_job_refuses_and_schedule_many_checks_what_it_is_given(thing, redis_client):
    with pytest.raises(InvalidSchedule, match="1970"):
        build_job(tasks.echo, at=datetime.datetime(1969, 1, 1, tzinfo=UTC))
    with pytest.raises(InvalidSchedule, match="surrogate"):
        build_job(tasks.echo, in_=1, args=["\ud800"])
    tampered = [
        ("run_at", datetime.datetime(1969, 1, 1, tzinfo=UTC), "1970"),
        ("run_at", datetime.datetime.max.replace(tzinfo=MINUS_5), "100 years"),
        ("expires_at", datetime.datetime(9999, 1, 1, tzinfo=UTC), "100 years"),
        ("args", ["a\x00"], "NUL"),
        ("args", [{"k\ud800": 1}], "surrogate"),
        ("args", nested(100_000), "deep"),
        ("kwargs", {"n": 2**70}, "64"),
        ("kwargs", {"f": float("nan")}, "NaN"),
        ("args", [object()], "JSON"),
        # tagged text that loads but is not what build_job writes (NUL: a DataError on PostgreSQL)
        ("args", [{"$dt": "2030-01-01\x0012:00:00"}], "writes as '2030-01-01T12:00:00'"),
        ("args", [{"$dt": "2030-01-01\ud80012:00:00"}], "writes as '2030-01-01T12:00:00'"),
        ("kwargs", {"d": {"$dec": " 1.5"}}, "writes as '1.5'"),
        ("args", ["x" * MIB], "MAX_JSON_BYTES"),
        ("max_attempts", 2**31, "2147483647"),
        ("priority", 2**15, "-100 to 100"),
        ("queue", "a b", "queue"),
        ("target_id", "x" * 65, "64"),
        # created_at in year 9999 -05:00: an OverflowError on SQLite, a row PostgreSQL stores
        # in year 10000 and cannot read back; naive: read in the default zone
        ("created_at", datetime.datetime.max.replace(tzinfo=MINUS_5), "created_at"),
        ("created_at", datetime.datetime.min.replace(tzinfo=PLUS_5), "created_at"),
        ("created_at", datetime.datetime(2030, 1, 1), "naive"),
        ("created_at", far(), "100 years from now"),
        ("created_at", "2030-01-01", "datetime"),
        ("created_at", None, "datetime"),
        # an id Django converts (42 to UUID(int=42), while Redis got "42") or refuses late
        ("id", 42, "UUID"),
        ("id", "not-a-uuid", "UUID"),
        ("id", None, "UUID"),
    ]
    for field, value, match in tampered:
        good = build_job(tasks.echo, in_=1, args=[1])
        bad = build_job(tasks.echo, in_=1, args=[2])
        setattr(bad, field, value)
        with pytest.raises((TypeError, InvalidSchedule), match=match):
            schedule_many([good, bad])
        assert not Job.objects.exists(), field
    with pytest.raises(InvalidSchedule, match="NUL"):
        schedule_many([build_job(tasks.echo, in_=1)], actor="\x00")
    assert redis_client.dbsize() == 0


def test_schedule_many_refuses_a_job_given_twice_or_not_new(redis_client):
    """The same built job twice, a job already scheduled, or one whose run state was
    changed (inserted as "succeeded", it would never run): InvalidSchedule, nothing
    written; never the database's IntegrityError."""
    job = build_job(tasks.echo, in_=60, args=[1])
    with pytest.raises(InvalidSchedule, match="twice"):
        schedule_many([job, build_job(tasks.echo, in_=60), job])
    assert not Job.objects.exists()
    for field, value in [("status", "succeeded"), ("attempts", 3), ("finished_at", timezone.now()),
                         ("last_error", "boom"), ("result", 1)]:  # fmt: skip
        changed = build_job(tasks.echo, in_=60)
        setattr(changed, field, value)
        with pytest.raises(InvalidSchedule, match=f"{field} changed"):
            schedule_many([build_job(tasks.echo, in_=60), changed])
        assert not Job.objects.exists(), field
    schedule_many([job])
    with pytest.raises(InvalidSchedule, match="already saved"):
        schedule_many([job])
    again = build_job(tasks.echo, in_=60)
    again.id = job.pk  # a new job given the id of a stored one: not the IntegrityError
    with pytest.raises(InvalidSchedule, match=f"job {job.pk} is already scheduled"):
        schedule_many([build_job(tasks.echo, in_=60), again])
    assert Job.objects.count() == 1 and JobEvent.objects.count() == 1


def test_schedule_many_refuses_a_job_whose_target_is_not_its_actions_model(thing, redis_client):
    """A built job whose target_type was changed to another model (or half cleared) would
    run another model's method of the same name: InvalidSchedule, nothing written."""
    sku = Sku.objects.create(code="SKU-1")
    moved = build_job(thing.touch, in_=60)
    moved.target_type = ContentType.objects.get_for_model(Sku)
    moved.target_id = sku.pk
    with pytest.raises(InvalidSchedule, match="not a method of its target's model"):
        schedule_many([build_job(thing.touch, in_=60), moved])
    function_on_a_row = build_job(tasks.echo, in_=60)
    function_on_a_row.target_type = ContentType.objects.get_for_model(Sku)
    function_on_a_row.target_id = sku.pk
    with pytest.raises(InvalidSchedule, match="not a method of its target's model"):
        schedule_many([function_on_a_row])
    half = build_job(thing.touch, in_=60)
    half.target_id = None
    with pytest.raises(InvalidSchedule, match="target_type without a target_id"):
        schedule_many([half])
    assert not Job.objects.exists()
    special = SpecialThing.objects.create(name="s")
    assert (
        len(schedule_many([build_job(special.touch, in_=60), build_job(thing.touch, in_=60)])) == 2
    )


def test_schedule_many_takes_tagged_values_build_job_made(redis_client):
    values = [datetime.datetime(2030, 1, 1, tzinfo=UTC), Decimal("1.5"), {"a": [1, None]}]
    (job,) = schedule_many([build_job(tasks.echo, in_=60, args=values)])
    assert load(Job.objects.get(pk=job.pk).args) == values


# -- the API: 400, nothing written --------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"at": "1960-01-01T00:00:00Z"},
        {"at": "1969-12-31T23:59:59.999999Z"},
        {"at": "9999-12-31T23:59:59Z"},
        {"at": "9999-12-31T23:59:59.999999-05:00"},
        {"at": "0001-01-01T00:00:00+05:00"},
        {"in": 1e300},
        {"in": "1e999"},
    ],
)
def test_api_reschedule_refuses_them_with_400(body):
    job = schedule(tasks.record, in_=3600, args=["x"])
    api = client_for(make_user(superuser=True))
    before = snapshot(job)
    response = api.post(url("jobs", job.pk, "reschedule"), body, format="json")
    assert response.status_code == 400, response.content
    assert snapshot(job) == before


def test_api_reschedule_refuses_a_huge_integer_with_400():
    job = schedule(tasks.record, in_=3600, args=["x"])
    api = client_for(make_user(superuser=True))
    body = '{"in": ' + "9" * 400 + "}"
    response = api.post(url("jobs", job.pk, "reschedule"), body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert "in" in response.json()


@pytest.mark.parametrize(
    "offset",
    [
        datetime.timedelta(microseconds=1),
        datetime.timedelta(days=-1, microseconds=1),
        datetime.timedelta(seconds=30),
    ],
)
def test_a_due_time_in_any_offset_is_stored_as_the_same_instant(thing, offset):
    """PostgreSQL cannot parse an offset with microseconds: the door stores UTC."""
    at = (timezone.now() + datetime.timedelta(hours=1)).astimezone(datetime.timezone(offset))
    job = schedule(thing.touch, at=at, expires=at + datetime.timedelta(hours=1))
    row = Job.objects.get(pk=job.pk)
    assert row.run_at - at == datetime.timedelta(0)
    assert row.expires_at - at == datetime.timedelta(hours=1)
    assert job.run_at.tzinfo == UTC
