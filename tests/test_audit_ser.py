"""Audit of the values that go in and come out: serialization, the registry and the door.
One test per finding; each says what used to happen."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from fractions import Fraction

import pytest
from django.core.exceptions import ObjectDoesNotExist

from django_delayjobs import cancel_for, cancel_on, delayable, schedule, schedule_many
from django_delayjobs.exceptions import AlreadyRunning, InvalidSchedule, NotDelayable
from django_delayjobs.models import Job
from django_delayjobs.registry import register
from django_delayjobs.services import build_job
from tests.testapp import tasks
from tests.testapp.models import SpecialThing, Thing, thing_paid

from .test_rest_helpers import running

pytestmark = pytest.mark.django_db(transaction=True)


HUGE = 10**5000  # repr() refuses an int of more than 4,300 digits (ValueError)


@pytest.mark.parametrize(
    ("tag", "raw"),
    [("$uuid", 5), ("$uuid", 2.5), ("$uuid", True), ("$uuid", [1]), ("$uuid", {"a": 1}),
     ("$dec", HUGE), ("$dt", HUGE), ("$d", None)],
    ids=["uuid-int", "uuid-float", "uuid-bool", "uuid-list", "uuid-dict", "dec-huge",
         "dt-huge", "d-none"],
)  # fmt: skip
def test_schedule_many_refuses_a_tag_holding_no_text(tag, raw):
    """``{"$uuid": 5}`` in a job's args reached ``uuid.UUID(5)``, whose AttributeError
    (``'int' object has no attribute 'replace'``) escaped ``schedule_many``; a huge int
    under another tag was quoted with ``repr()``, whose ValueError ("Exceeds the limit
    (4300 digits)") escaped instead of the ``InvalidSchedule`` naming the value."""
    job = build_job(tasks.keep, in_=0)
    job.args = [{tag: raw}]
    with pytest.raises(InvalidSchedule, match=rf"args\[0\] holds \{tag} with a"):
        schedule_many([job])
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "call",
    [
        lambda: schedule(tasks.keep, in_=0, args=[{HUGE: 1}]),
        lambda: schedule(tasks.keep, in_=0, args=[{"a": {(HUGE, 1): 1}}]),
        lambda: schedule(tasks.keep, in_=0, key=HUGE),
        lambda: schedule(tasks.keep, in_=Fraction(HUGE)),
        lambda: schedule_many([_with_id(HUGE)]),
    ],
    ids=["key-of-args", "nested-tuple-key", "key", "in_", "job-id"],
)
def test_a_huge_int_where_text_belongs_is_refused_naming_the_field(call):
    """The messages quoted the bad value with ``repr()``, which raises ``ValueError``
    ("Exceeds the limit (4300 digits) for integer string conversion") for a huge int: that
    error escaped instead of the door's, naming neither the field nor what to do."""
    with pytest.raises(TypeError) as refused:
        call()
    message = str(refused.value)
    assert "4300 digits" not in message, message
    assert message.startswith(
        ("args[0] has a key", "args[0]['a'] has a key", "key must be", "in_ must be", "a job's id")
    )
    assert not Job.objects.exists()


def _with_id(pk: object) -> Job:
    job = build_job(tasks.keep, in_=0)
    job.id = pk
    return job


def _no_str(self: Thing) -> str:  # what a __str__ reading an unset foreign key raises
    raise ObjectDoesNotExist("Thing has no customer.")


def test_an_unsaved_instance_whose_str_fails_is_refused_with_the_doors_error(monkeypatch):
    """The refusal of an unsaved instance (and ``cancel_for``'s messages) quoted it with
    ``repr()``, which calls the model's ``__str__``: one that reads a foreign key not set
    yet raised ``RelatedObjectDoesNotExist`` out of ``schedule()`` instead of the door's
    ``InvalidSchedule``."""
    monkeypatch.setattr(Thing, "__str__", _no_str)
    with pytest.raises(InvalidSchedule, match="unsaved Thing"):
        schedule(Thing().expire, in_=0)
    with pytest.raises(ValueError, match="not saved"):
        cancel_for(Thing())
    assert not Job.objects.exists()
    thing = Thing.objects.create()
    running(schedule(thing.expire, in_=0))
    with pytest.raises(AlreadyRunning, match=rf"testapp.Thing.expire for Thing {thing.pk} is"):
        cancel_for(thing, fail_if_running=True)


def test_cancel_for_cancels_the_rows_jobs_whichever_proxy_scheduled_them():
    """A job scheduled through a proxy instance names the proxy's content type (so that the
    proxy's method runs), and ``cancel_for`` looked only under the content type of the
    instance it was given: ``cancel_for(order)`` left the job that ``PendingOrder(proxy)``
    scheduled on the same row to run after the payment, and the other way round."""
    special = SpecialThing.objects.create(name="s")
    thing = Thing.objects.get(pk=special.pk)
    via_proxy, via_model = schedule(special.touch, in_=3600), schedule(thing.touch, in_=3600)
    other = schedule(Thing.objects.create().touch, in_=3600)
    assert cancel_for(thing, Thing.touch) == 2
    assert {job.status for job in Job.objects.filter(pk__in=[via_proxy.pk, via_model.pk])} == {
        "cancelled"
    }
    via_proxy, via_model = schedule(special.touch, in_=3600), schedule(thing.expire, in_=3600)
    assert cancel_for(thing, "testapp.Thing.touch") == 0  # a name given as text is exact
    assert cancel_for(thing, thing.touch) == 1  # the bound method: as Thing.touch
    assert cancel_for(special) == 1
    assert Job.objects.get(pk=other.pk).status == "scheduled"


@pytest.mark.parametrize("atomic", ["false", "no", None, 0, 1])
def test_delayable_refuses_an_atomic_that_is_not_a_bool(atomic):
    """``@delayable(atomic="false")`` was taken as true (a non-empty string), so the action
    ran inside the outcome's transaction, holding it open across the outside call it was
    meant to run outside of; ``atomic=None`` was taken as false."""
    with pytest.raises(TypeError, match="atomic must be a bool"):
        delayable(atomic=atomic)
    with pytest.raises(TypeError, match="atomic must be a bool"):
        register("tests.audit_ser.never", tasks.keep, atomic=atomic)


def test_cancel_for_and_cancel_on_refuse_a_fail_if_running_that_is_not_a_bool():
    """``fail_if_running="false"`` was read by its truth, as ``True``: a payment arriving
    while the job ran was rolled back with ``AlreadyRunning`` by a caller that had said
    no. ``replace=`` was already checked this way."""
    thing = Thing.objects.create()
    running(schedule(thing.expire, in_=0))
    with pytest.raises(TypeError, match="fail_if_running must be a bool"):
        cancel_for(thing, fail_if_running="false")
    with pytest.raises(TypeError, match="fail_if_running must be a bool"):
        cancel_on(thing_paid, Thing.expire, fail_if_running="false")


def _steps(n: int) -> Iterator[int]:  # a generator function: calling it runs none of it
    Thing.objects.create(name="ran")
    yield n


async def _async_steps(n: int) -> AsyncIterator[int]:
    yield n


@pytest.mark.parametrize("func", [_steps, _async_steps])
def test_delayable_refuses_a_generator_function(func):
    """A generator function was registered: a job of it "ran" by making a generator,
    none of its body, and then failed every attempt on the return value (a generator is
    not JSON) until it was dead."""
    with pytest.raises(NotDelayable, match="generator"):
        delayable(func)
    with pytest.raises(NotDelayable, match="generator"):
        delayable(atomic=False)(func)


def _from_database(alias: str, pk: object) -> Thing:
    """A Thing as ``Thing.objects.using(alias).get(pk=pk)`` gives it: Django notes the
    database an instance was read from in ``_state.db`` (no query here, so the alias need
    not be configured)."""
    thing = Thing(pk=pk, name="elsewhere")
    thing._state.adding, thing._state.db = False, alias
    return thing


def test_a_target_read_from_another_database_is_refused():
    """The worker reads a job's target on ``db_for_write`` of its model, with no instance
    to route by: a target read from another database (``.using("shard2")``, without a
    router that sends its writes there) was accepted, and its job ran on the row of the
    same pk in the default database, another object; ``cancel_for`` on it cancelled that
    row's jobs."""
    here = Thing.objects.create(name="here")
    job = schedule(here.touch, in_=3600)
    elsewhere = _from_database("shard2", here.pk)
    with pytest.raises(InvalidSchedule, match="'shard2'"):
        schedule(elsewhere.touch, in_=0)
    assert Job.objects.count() == 1
    assert cancel_for(elsewhere) == 0
    assert Job.objects.get(pk=job.pk).status == "scheduled"
    assert schedule(_from_database("default", here.pk).touch, in_=0)  # where it is read
