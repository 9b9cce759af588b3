"""The scheduling API's door, third audit: numbers and times given as instances of a
subclass (of int, float, timedelta or datetime) are read through their base type's own
methods, as ``serialization`` reads arguments, so that what is checked is what is stored
and handed to Redis. A real Redis and a real worker (--burst in this process)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from django.core.management import call_command

from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.exceptions import InvalidSchedule, NotDelayable
from django_delayjobs.models import Job, Status
from django_delayjobs.services import build_job, schedule_many
from django_delayjobs.timing import to_ms
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

UTC = datetime.UTC


class Fibbing(int):
    """An int whose comparisons say it is within any bound, and whose ``int()`` lies."""

    def __lt__(self, other: object) -> bool:
        return False

    def __gt__(self, other: object) -> bool:
        return False

    def __int__(self) -> int:
        return 1_000_000


class FibbingFloat(float):
    def __lt__(self, other: object) -> bool:
        return False

    def __gt__(self, other: object) -> bool:
        return False


class Stretched(datetime.timedelta):
    """A timedelta whose ``total_seconds()`` says 5, whatever it holds."""

    def total_seconds(self) -> float:
        return 5.0


class Dressed(datetime.datetime):
    """A datetime whose own methods describe another time than the one it holds (a
    subclass that formats or converts itself its own way: Django writes ``str()`` of it
    to SQLite, and ``to_ms`` subtracts with its ``__sub__``)."""

    def __str__(self) -> str:
        return "2031-01-01 00:00:00"

    def isoformat(self, sep: str = "T", timespec: str = "auto") -> str:
        return "2031-01-01T00:00:00+00:00"

    def astimezone(self, tz: Any = None) -> Dressed:
        return self

    def __sub__(self, other: Any) -> Any:
        if isinstance(other, datetime.datetime):
            return datetime.timedelta(0)
        return super().__sub__(other)


def pending_score(job: Job) -> float | None:
    """The due time Redis holds for ``job`` (ms), pending or promoted (None: neither)."""
    engine = get_engine()
    score = engine.client.zscore(engine.keys(job.queue).pending, str(job.pk))
    return None if score is None else float(score)


@pytest.mark.parametrize(
    "options",
    [
        {"in_": 0, "max_attempts": Fibbing(-5)},
        {"in_": 0, "max_attempts": Fibbing(2**40)},
        {"in_": Fibbing(-(10**6))},
        {"in_": Fibbing(10**12)},
        {"in_": FibbingFloat(-1e6)},
        {"in_": 1, "expires": Fibbing(10**12)},
    ],
    ids=[
        "attempts-below-1",
        "attempts-past-32-bits",
        "in-negative",
        "in-past-100-years",
        "in-negative-float",
        "expires-past-100-years",
    ],
)
def test_an_int_or_float_subclass_is_checked_by_its_value(options):
    """Its own comparisons decided the bounds: ``max_attempts=-5`` escaped as the database's
    ``IntegrityError`` (a CHECK constraint) and 2**40 was stored on SQLite (PostgreSQL's
    integer column refuses it), ``in_`` of -10**6 s made a job due 11 days ago, 10**12 s
    escaped as an ``OverflowError``. Now each is ``InvalidSchedule``, and nothing is written."""
    with pytest.raises(InvalidSchedule):
        schedule(tasks.keep, **options)
    assert not Job.objects.exists()


def test_an_int_subclass_is_stored_as_the_int_it_holds():
    """``priority`` took ``int()`` of the subclass (its ``__int__``, 1,000,000) after
    checking the value it holds (5); ``max_attempts`` was stored as given."""
    job = schedule(tasks.keep, in_=60, priority=Fibbing(5), max_attempts=Fibbing(3))
    job.refresh_from_db()
    assert (job.priority, job.max_attempts) == (5, 3)


def test_a_timedelta_subclass_is_read_by_its_value():
    """``in_=`` was read through the subclass's ``total_seconds()``: 1,000 days became 5 s."""
    before = datetime.datetime.now(UTC)
    job = schedule(tasks.keep, in_=Stretched(days=1000), expires=Stretched(days=1))
    job.refresh_from_db()
    assert job.run_at - before >= datetime.timedelta(days=1000)
    assert job.expires_at - job.run_at == datetime.timedelta(days=1)


def test_a_datetime_subclass_is_stored_and_handed_to_redis_as_the_time_it_holds():
    """The row held the time its ``str()`` wrote (2031 on SQLite), Redis the ms its
    ``__sub__`` gave (0: due at once), and the ``scheduled`` event its ``isoformat()``;
    the job ran in 2026 although due in 2030 by the value given."""
    at = datetime.datetime(2030, 1, 1, tzinfo=UTC)
    expires = datetime.datetime(2030, 1, 2, tzinfo=UTC)
    job = schedule(
        tasks.keep, at=Dressed(2030, 1, 1, tzinfo=UTC), expires=Dressed(2030, 1, 2, tzinfo=UTC)
    )
    assert type(job.run_at) is datetime.datetime
    job.refresh_from_db()
    assert (job.run_at, job.expires_at) == (at, expires)
    assert pending_score(job) == to_ms(at)
    assert job.events.get().message == f"due {at.isoformat()}"
    call_command("run_delayworker", "--burst", "-v", "0")
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.SCHEDULED, 0)


def test_a_datetime_subclass_in_a_built_job_is_stored_as_the_time_it_holds():
    """``schedule_many`` re-checks a job's ``run_at`` with the same door."""
    at = datetime.datetime(2030, 1, 1, tzinfo=UTC)
    job = build_job(tasks.keep, in_=0)
    job.run_at = Dressed(2030, 1, 1, tzinfo=UTC)
    schedule_many([job])
    job.refresh_from_db()
    assert job.run_at == at
    assert pending_score(job) == to_ms(at)


@pytest.mark.parametrize(
    "at",
    [
        Dressed(1, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=5))),
        Dressed(9999, 12, 31, 23, tzinfo=datetime.timezone(datetime.timedelta(hours=-5))),
    ],
    ids=["year-1", "year-9999"],
)
def test_a_datetime_subclass_at_the_limits_is_refused_clearly(at):
    with pytest.raises(InvalidSchedule):
        schedule(tasks.keep, at=at)
    assert not Job.objects.exists()


def test_an_int_subclass_in_a_built_job_is_stored_as_the_int_it_holds():
    """``schedule_many`` checked ``max_attempts`` (3) and left the subclass on the job:
    Django's integer field writes ``int()`` of it, which the subclass says is 1,000,000."""
    job = build_job(tasks.keep, in_=60)
    job.max_attempts = Fibbing(3)
    schedule_many([job])
    job.refresh_from_db()
    assert job.max_attempts == 3


class Posing(str):
    """A str whose hash and ``rpartition`` are another action's: ``schedule_many`` checked
    the registry and the target by them, and stored the text it holds."""

    def __hash__(self) -> int:
        return hash("tests.testapp.tasks.keep")

    def __eq__(self, other: object) -> bool:
        return other == "tests.testapp.tasks.keep" or str.__eq__(self, other)

    def rpartition(self, sep: str) -> tuple[str, str, str]:  # type: ignore[override]
        return "tests.testapp.tasks.keep".rpartition(sep)


def test_an_action_name_of_a_str_subclass_is_checked_as_the_text_it_holds():
    """It passed the door as ``tests.testapp.tasks.keep`` and was stored as a name no
    action has: the job went dead at its first attempt."""
    job = build_job(tasks.keep, in_=0)
    job.action = Posing("tests.testapp.tasks.nothing_by_this_name")
    with pytest.raises(NotDelayable, match="nothing_by_this_name"):
        schedule_many([job])
    assert not Job.objects.exists()


class Offset(datetime.datetime):
    """A naive datetime whose ``utcoffset()`` says UTC: it holds no time zone."""

    def utcoffset(self) -> datetime.timedelta:
        return datetime.timedelta(0)


def test_a_naive_datetime_subclass_that_claims_an_offset_is_naive():
    """Asked through its own ``utcoffset()``, it passed for aware, and was then read as a
    time in the project's zone, or failed to subtract."""
    with pytest.raises(InvalidSchedule, match="naive"):
        schedule(tasks.keep, at=Offset(2030, 1, 1))
    assert not Job.objects.exists()
