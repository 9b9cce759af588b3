"""Audit of serialization and the backend's door, second pass. One test per class of
defect; each says what used to happen."""

from __future__ import annotations

import datetime
import uuid
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from django_delayjobs import schedule
from django_delayjobs.backends import InvalidTask
from django_delayjobs.exceptions import InvalidSchedule
from django_delayjobs.models import Job
from django_delayjobs.serialization import dump, load
from tests.testapp import task_functions as t
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

LONG = "k" * 100_000


def _deep(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    "kwargs",
    [{LONG: _deep(40)}, {LONG: [0, "\x00"]}, {LONG: {LONG: [1, 2**80]}}, {"a": {LONG: {3}}}],
    ids=["too-deep", "nul", "big-int", "set"],
)
def test_a_long_key_is_quoted_short_in_the_path(kwargs):
    """The path of a value repeated the whole repr of every parent key (built for every
    element, even when nothing was wrong): 2.4 MB of kwargs took 11 s of CPU to refuse,
    and the message quoted each key in full."""
    with pytest.raises((TypeError, ValueError)) as refused:
        schedule(tasks.keep, in_=0, kwargs=kwargs)
    assert len(str(refused.value)) < 2_000
    assert not Job.objects.exists()


class BadRepr(str):
    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    __hash__ = str.__hash__


class BadReprKey:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


@pytest.mark.parametrize(
    "call",
    [
        lambda: schedule(tasks.keep, in_=0, kwargs={"a": {BadReprKey(): 1}}),
        lambda: schedule(tasks.keep, in_=0, kwargs={"a": {BadRepr("b"): "\x00"}}),
        lambda: schedule(tasks.keep, in_=0, key=BadReprKey()),
        lambda: schedule(tasks.keep, in_=0, queue=BadRepr("not a name")),
    ],
    ids=["non-str-key", "str-key", "key", "queue"],
)
def test_a_raising_repr_gives_the_doors_error(call):
    """``short_repr`` caught only ValueError: a key whose ``__repr__`` raised made
    ``schedule()`` raise that RuntimeError instead of TypeError/InvalidSchedule."""
    with pytest.raises((TypeError, ValueError)):
        call()
    assert not Job.objects.exists()


class HideIter(dict):  # type: ignore[type-arg]
    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(["x"])


class NeverEqual(str):
    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = str.__hash__


class Money(Decimal):
    def __str__(self) -> str:
        return f"{Decimal.__str__(self)} EUR"


class OwnId(uuid.UUID):
    def __str__(self) -> str:
        return "id:" + uuid.UUID.__str__(self)


class Fancy(datetime.date):
    def isoformat(self) -> str:  # type: ignore[override]
        return "the first of January"


class FancyTime(datetime.datetime):
    def isoformat(self, *args: object, **kwargs: object) -> str:  # type: ignore[override]
        return "noon"

    def utcoffset(self) -> None:
        return None


class Hidden(str):
    def __contains__(self, item: object) -> bool:
        return False

    def isascii(self) -> bool:
        return True

    __hash__ = str.__hash__


class Small(float):
    def __abs__(self) -> float:
        return 0.0


class Fits(int):
    def __ge__(self, other: object) -> bool:
        return True

    def __le__(self, other: object) -> bool:
        return True


class TwoFaces(dict):  # type: ignore[type-arg]
    """Holds one set of kwargs, and gives another from ``items()``."""

    def items(self):  # type: ignore[no-untyped-def]
        return [("nonsense", 1)]


NOON = datetime.datetime(2020, 1, 1, 12, tzinfo=datetime.UTC)


@pytest.mark.parametrize(
    ("value", "base"),
    [
        (HideIter({"$dt": "2020-01-01T00:00:00"}), None),
        ({NeverEqual("$d"): "2020-01-01"}, None),
        (Money("1.5"), Decimal("1.5")),
        (OwnId(int=5), uuid.UUID(int=5)),
        (Fancy(2020, 1, 1), datetime.date(2020, 1, 1)),
        (FancyTime(2020, 1, 1, 12, tzinfo=datetime.UTC), NOON),
        (Hidden("a\x00b"), None),
        (Hidden("a\ud800b"), None),
        ({Hidden("a\x00"): 1}, None),
        (Small(1e20), None),
        (Fits(2**80), None),
        ([Fits(2**80)], None),
    ],
    ids=["dict-iter", "key-eq", "decimal", "uuid", "date", "datetime", "str-nul",
         "str-surrogate", "key-nul", "float-abs", "int-compare", "list-int"],
)  # fmt: skip
def test_a_subclass_is_read_as_its_base_type(value, base):
    """A subclass's overridden methods decided what was checked and stored: a dict hiding
    its one key from ``__iter__`` or a key never equal to anything passed the reserved
    tag check (and came back as a date); a Decimal, UUID or date with its own text was
    stored as text that does not load (dead at the first run); a str hiding NUL from
    ``in``, a float whose ``abs`` is 0 and an int that compares within any bound passed
    the limits. Each is now refused, or stored as its base type's value."""
    if base is None:
        with pytest.raises((TypeError, ValueError)):
            schedule(tasks.keep, in_=0, args=[value])
        assert not Job.objects.exists()
        return
    job = schedule(tasks.keep, in_=0, args=[value])
    (loaded,) = load(Job.objects.get(pk=job.pk).args)
    assert type(loaded) is type(base) and loaded == base
    assert job.args == dump([base])


def test_a_key_that_hides_its_nul_is_refused():
    with pytest.raises(ValueError, match="NUL"):
        schedule(tasks.keep, in_=0, key=Hidden("k\x00"))
    assert not Job.objects.exists()


def test_kwargs_are_checked_as_they_are_stored():
    """``check_arguments`` bound the kwargs through the dict's own storage (``**``) while
    ``dump`` read ``items()``: checked as one set of kwargs, stored as another, the job
    died at its first run. Both read ``items()`` once now: refused at the door."""
    with pytest.raises(TypeError, match="do not fit slow"):
        schedule(tasks.slow, in_=3600, kwargs=TwoFaces(label="x", seconds=1))
    assert not Job.objects.exists()


class Apart(str):
    """A key that hashes apart from its own text."""

    def __hash__(self) -> int:
        return 7


def test_a_kwarg_key_apart_from_its_text_is_checked_as_the_text_it_is_stored_as():
    """Bound through its own hash, the key fell into ``**extra``: beside ``label`` given
    by position it was accepted, stored as ``label``, and the run failed (two values)."""
    with pytest.raises(TypeError, match="multiple values for argument 'label'"):
        schedule(tasks.record, in_=3600, args=["x"], kwargs={Apart("label"): "y"})
    job = schedule(tasks.record, in_=3600, kwargs={Apart("label"): "y"})
    assert Job.objects.get(pk=job.pk).kwargs == {"label": "y"}
    with pytest.raises(ValueError, match="two keys of the same text"):
        schedule(tasks.record, in_=3600, kwargs={Apart("label"): "y", "label": "z"})


def test_a_query_dict_is_stored_as_its_items_give_it():
    """Read by ``dict``'s own methods, a ``QueryDict`` was stored as its lists of values;
    ``items()`` gives each key's last value, as before."""
    from django.http import QueryDict

    query = QueryDict("a=1&a=2&b=3")
    job = schedule(tasks.keep, in_=3600, args=[query], kwargs={"extra": query})
    row = Job.objects.get(pk=job.pk)
    assert row.args == [{"a": "2", "b": "3"}] and row.kwargs == {"extra": {"a": "2", "b": "3"}}


class NoOffset(datetime.tzinfo):
    pass


def test_a_run_after_whose_zone_fails_is_an_invalid_task():
    """A ``run_after`` whose tzinfo cannot give an offset escaped Django's own
    ``validate_task`` as NotImplementedError."""
    when = timezone.now().replace(tzinfo=NoOffset())
    with pytest.raises(InvalidTask, match="time zone"):
        t.add.using(run_after=when).enqueue(1, 2)
    assert not Job.objects.exists()


def test_a_key_of_a_str_subclass_beside_the_same_text_in_a_plain_dict_is_refused():
    """Two entries of a plain dict (the subclass hashes apart) that are one key as text:
    stored, one would silently replace the other."""

    value = {Apart("a"): 1, "a": 2}  # a plain dict
    assert len(value) == 2
    with pytest.raises(InvalidSchedule, match="two keys of the same text"):
        dump(value)


class Sneaky(dict):  # type: ignore[type-arg]
    def items(self):  # type: ignore[no-untyped-def]
        return [("a", "x\x00")]  # what json.dumps would write for the row


def test_schedule_many_takes_only_the_json_types_dump_makes():
    """A job built by hand: its stored arguments must be what ``dump`` returns, exact
    ``dict``, ``list`` and ``str`` included; a subclass's own methods are not trusted."""
    from django_delayjobs.services import build_job, schedule_many

    job = build_job(tasks.keep, in_=0)
    job.args = [Sneaky(a="fine")]
    with pytest.raises(TypeError, match="not JSON"):
        schedule_many([job])
    assert not Job.objects.exists()
