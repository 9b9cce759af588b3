"""Audit rv5 of what the door takes: each value it accepts is stored, read back, run and
shown as given. One test per finding; each says what used to happen."""

from __future__ import annotations

import enum

import pytest

from django_delayjobs import cancel_for, schedule, schedule_many
from django_delayjobs.connection import get_engine
from django_delayjobs.exceptions import InvalidSchedule
from django_delayjobs.models import Job, Status
from django_delayjobs.services import build_job
from tests.testapp import tasks
from tests.testapp.models import Sku, Thing

from .test_rest_helpers import burst

pytestmark = pytest.mark.django_db(transaction=True)


class Priority(enum.IntEnum):
    HIGH = 5


class Queue(str, enum.Enum):  # noqa: UP042 (not StrEnum: the idiom that formats apart)
    """The common idiom for names: its f-string is "Queue.ORDERS", its text "orders"."""

    ORDERS = "orders"


def _pending(queue: str) -> set[str]:
    engine = get_engine()
    return {i.decode() for i in engine.client.zrange(engine.keys(queue).pending, 0, -1)}


@pytest.mark.parametrize("how", ["schedule", "schedule_many", "DEFAULT_QUEUE"])
def test_a_queue_given_as_a_str_enum_is_the_queue_its_text_names(how, settings):
    """The row stored the enum's text ("orders") but Redis got the id under the keys of
    ``f"{queue}"`` ("Queue.ORDERS"), which no worker of "orders" reads: the job waited
    for reconcile, and its id stayed in the other queue's keys for good."""
    if how == "schedule":
        job = schedule(tasks.keep, in_=60, queue=Queue.ORDERS)
    elif how == "schedule_many":
        job = build_job(tasks.keep, in_=60)
        job.queue = Queue.ORDERS
        schedule_many([job])
    else:
        settings.DELAYJOBS = {**settings.DELAYJOBS, "DEFAULT_QUEUE": Queue.ORDERS}
        job = schedule(tasks.keep, in_=60)
    assert _pending("orders") == {str(job.pk)}
    assert _pending("Queue.ORDERS") == set()
    assert type(job.queue) is str and job.queue == "orders"


def test_a_target_whose_pk_is_a_str_enum_is_its_row():
    """The job named its target by ``str(pk)`` ("Queue.ORDERS"), while the row's key is
    the enum's text ("orders"): the worker found no such row and skipped the job, and
    ``cancel_for`` of the row cancelled nothing."""
    sku = Sku.objects.create(code=Queue.ORDERS)
    job = schedule(sku.touch, in_=0)
    assert cancel_for(Sku.objects.get(pk="orders")) == 1
    job = schedule(sku.touch, in_=0)
    burst()
    job.refresh_from_db()
    assert job.status == Status.SUCCEEDED, job.last_error
    assert Job.objects.get(pk=job.pk).target_id == "orders"


@pytest.mark.parametrize("how", ["schedule", "schedule_many"])
def test_a_priority_given_as_an_int_enum_reaches_redis_as_its_number(how, caplog):
    """redis-py sends an int as its ``repr()``, which for an IntEnum member is
    "<Priority.HIGH: 5>": the add script refused it, and the job (its row committed)
    waited for reconcile, with an error logged for each schedule."""
    if how == "schedule":
        job = schedule(tasks.keep, in_=60, priority=Priority.HIGH)
    else:
        job = build_job(tasks.keep, in_=60)
        job.priority = Priority.HIGH
        schedule_many([job])
    assert _pending("default") == {str(job.pk)}
    assert "could not hand jobs to Redis" not in caplog.text
    engine = get_engine()
    assert engine.client.hget(engine.keys("default").priority, str(job.pk)) == b"5"


@pytest.mark.parametrize("value", ["abc", ""])
def test_schedule_many_refuses_a_target_type_that_is_no_id_with_the_doors_error(value):
    """Django's lookup of the content type raised its own ValueError ("Field 'id'
    expected a number but got 'abc'"), which escaped ``schedule_many`` instead of the
    door's ``InvalidSchedule`` (nothing else escapes for a bad value)."""
    job = build_job(Thing.objects.create().touch, in_=60)
    job.target_type_id = value
    with pytest.raises(InvalidSchedule, match="target_type"):
        schedule_many([job])
    assert not Job.objects.exists()


@pytest.mark.parametrize("spelling", ["abc", "0{pk}", " {pk}"])
def test_schedule_many_refuses_a_target_id_build_job_would_not_write(spelling):
    """A job handed to ``schedule_many`` may hold any text as its target's key. One the
    pk field cannot read ("abc" for an integer key) was taken, and each attempt raised
    Django's ValueError looking the row up, till the job was dead; another spelling of a
    key ("042") ran on row 42, but ``cancel_for(row)`` looked for "42" and missed it."""
    thing = Thing.objects.create()
    job = build_job(thing.touch, in_=60)
    job.target_id = spelling.format(pk=thing.pk)
    with pytest.raises(InvalidSchedule, match="target"):
        schedule_many([job])
    assert not Job.objects.exists()
