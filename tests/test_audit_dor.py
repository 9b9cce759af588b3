"""Audit of the scheduling door, round 2: every entry point that creates or changes a job.
One test per finding; each says what used to happen."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Callable

import pytest
from django.utils import timezone

from django_delayjobs import (
    cancel_for,
    delayable,
    registry,
    schedule,
    schedule_http,
    schedule_many,
)
from django_delayjobs.callbacks import policy
from django_delayjobs.exceptions import InvalidSchedule, NotDelayable
from django_delayjobs.models import Job
from django_delayjobs.services import build_job, cancel, purge, requeue, reschedule
from tests.testapp import tasks
from tests.testapp.models import Thing

from .test_poison import plant
from .test_rest_helpers import client_for, dead_job, make_user, snapshot, url

pytestmark = pytest.mark.django_db(transaction=True)

HOUR = datetime.timedelta(hours=1)


def _expired_batch() -> None:
    job = build_job(tasks.record, in_=0, args=["x"], expires=HOUR)
    job.run_at, job.expires_at = job.run_at - 2 * HOUR, job.run_at - HOUR
    schedule_many([job])


@pytest.mark.parametrize(
    "call",
    [
        lambda now: schedule(tasks.record, at=now - 2 * HOUR, expires=now - HOUR, args=["x"]),
        lambda now: schedule(tasks.record, at=now - 2 * HOUR, expires=HOUR, args=["x"]),
        lambda now: _expired_batch(),
    ],
    ids=["expires-datetime", "expires-delay", "schedule_many"],
)
def test_a_job_expired_before_it_is_scheduled_is_refused(call):
    """A due time in the past with an expiry also past (``at`` two hours ago, ``expires``
    an hour after it) was accepted, and the job was skipped at its first claim: never to
    run, where ``requeue`` and ``reschedule`` refuse such a job."""
    with pytest.raises(InvalidSchedule, match="already passed"):
        call(timezone.now())
    assert not Job.objects.exists()


def test_a_job_past_its_expiry_cannot_be_rescheduled_to_a_time_before_it():
    """``reschedule(at=...)`` checked the new due time against the expiry only: a waiting
    job whose expiry has passed took a due time before it, to be skipped at once."""
    job = schedule(tasks.record, in_=3600, args=["x"], expires=HOUR)
    past = timezone.now() - datetime.timedelta(minutes=1)
    Job.objects.filter(pk=job.pk).update(expires_at=past)
    job.refresh_from_db()
    before = snapshot(job)
    with pytest.raises(InvalidSchedule, match="already passed"):
        reschedule(job, at=past - HOUR)
    assert snapshot(job) == before


def _action_named(qualname: str) -> Callable[[], None]:
    def action() -> None:
        pass

    action.__qualname__ = action.__name__ = qualname
    return action


@pytest.mark.parametrize(
    ("qualname", "why"),
    [("x" * 256, "characters long"), ("a\x00b", "NUL"), ("a\ud800b", "surrogate")],
    ids=["too-long", "nul", "surrogate"],
)
def test_delayable_refuses_a_function_whose_name_no_job_can_store(qualname, why):
    """``@delayable`` registered a function whose ``<module>.<qualname>`` the ``action``
    column cannot hold (more than 255 characters, a NUL, a lone surrogate): the decorator
    said nothing, and every ``schedule()`` of it raised ``InvalidSchedule`` instead."""
    action = _action_named(qualname)
    with pytest.raises(NotDelayable, match=why):
        delayable(action)
    assert f"{__name__}.{qualname}" not in registry._functions
    with pytest.raises(NotDelayable, match="not registered"):
        schedule(action, in_=0)


@pytest.mark.parametrize("name", ["", 42, None])
def test_register_refuses_a_name_that_is_not_a_non_empty_str(name):
    with pytest.raises(NotDelayable, match="name"):
        registry.register(name, _action_named("fine"))
    assert name not in registry._functions


def _changed(**fields: object) -> Callable[[], list[Job]]:
    def call() -> list[Job]:
        job = build_job(Thing.objects.create().touch if "method" in fields else tasks.record,
                        in_=0, args=[] if "method" in fields else ["x"])  # fmt: skip
        for name, value in fields.items():
            setattr(job, name if name != "method" else "action", value)
        return schedule_many([job])

    return call


@pytest.mark.parametrize(
    ("call", "error", "why"),
    [
        (_changed(action="os.system"), NotDelayable, "no @delayable function"),
        (_changed(method="testapp.Thing.not_delayable"), NotDelayable, "not a @delayable"),
        (_changed(args=["x", "y", "z"]), TypeError, "do not fit"),
        (_changed(kwargs={"label": "y"}), TypeError, "do not fit"),
        (_changed(method="testapp.Thing.touch", args=[1]), TypeError, "do not fit"),
    ],
    ids=["unregistered", "undecorated-method", "args", "kwargs", "method-args"],
)
def test_schedule_many_refuses_a_job_no_worker_would_run(call, error, why):
    """``schedule_many`` re-checked a job's values but not its action: a job whose action
    names no registered function (``os.system``) or no ``@delayable`` method was inserted
    and went dead at its first claim, and one whose arguments do not fit its action was
    retried ``max_attempts`` times with a ``TypeError`` before it did, where ``schedule``
    refuses both at once."""
    with pytest.raises(error, match=why):
        call()
    assert not Job.objects.exists()


@pytest.mark.parametrize("name", ["args nested 1500 deep", "kwargs 5000-digit int"])
@pytest.mark.parametrize("replace", [False, True], ids=["keep", "replace"])
def test_a_poison_row_holding_the_key_is_returned_or_replaced(name, replace):
    """``schedule(key=...)`` read the job holding the key the ordinary way: a holder whose
    row cannot be read back (a poison row: JSON nested deeper than Python parses, a
    5,000-digit int) made every ``schedule`` of that key raise ``RecursionError`` or
    ``ValueError``, ``replace=True`` included, which must cancel it (a poison row can be
    cancelled)."""
    holder = schedule(tasks.record, in_=60, args=["poison"], key="k")
    plant(holder, name)
    job = schedule(tasks.record, in_=60, args=["x"], key="k", replace=replace)
    if replace:
        assert job.pk != holder.pk
        status = Job.objects.filter(pk=holder.pk).values_list("status", flat=True)
        assert list(status) == ["cancelled"]
    else:
        assert job.pk == holder.pk
        assert Job.objects.filter(key="k").count() == 1


@pytest.mark.parametrize("name", ["args nested 1500 deep", "kwargs 5000-digit int"])
@pytest.mark.parametrize("fail_if_running", [False, True], ids=["plain", "fail_if_running"])
def test_cancel_for_and_cancel_by_id_cancel_a_poison_row(name, fail_if_running):
    """``cancel_for(obj)`` read the object's jobs the ordinary way, and ``cancel(job_id)``
    the job: a poison row among them made them raise ``RecursionError``/``ValueError``
    (a payment's ``cancel_for(order)`` failed for good), though such a job can be
    cancelled."""
    thing = Thing.objects.create()
    poison, fine = schedule(thing.touch, in_=60), schedule(thing.expire, in_=60)
    plant(poison, name)
    assert cancel_for(thing, fail_if_running=fail_if_running) == 2
    other = schedule(tasks.record, in_=60, args=["x"])
    plant(other, name)
    assert cancel(other.pk) is True
    statuses = Job.objects.values_list("status", flat=True)
    assert set(statuses.filter(pk__in=[poison.pk, fine.pk, other.pk])) == {"cancelled"}


@pytest.mark.parametrize("by", ["key", "id"])
def test_the_callback_endpoints_cancel_a_poison_callback(by, settings):
    """``callbacks/cancel/`` found the callback by reading its row the ordinary way, and
    answered with its row read so again: a poison row (here its kwargs, a 5,000-digit int)
    was a 500, though the job could be cancelled."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "HTTP_ALLOWED_HOSTS": ["hooks.example.com"]}
    with policy.use_resolver(lambda host, port: [ipaddress.ip_address("93.184.215.14")]):
        job = schedule_http("https://hooks.example.com/x", in_=60, key="order-1")
    plant(job, "kwargs 5000-digit int")
    api = client_for(make_user(superuser=True))
    body = {"key": "order-1"} if by == "key" else {"id": str(job.pk)}
    response = api.post(url("callbacks", "cancel"), body, format="json")
    assert response.status_code == 200, response.content[:300]
    assert response.json()["status"] == "cancelled"


@pytest.mark.parametrize("name", ["args nested 1500 deep", "kwargs 5000-digit int"])
def test_a_dead_poison_row_can_be_requeued_or_purged(name):
    """``requeue`` read the revived row back whole, and ``purge`` had Django load the rows
    it deletes: for a dead poison row both raised ``RecursionError``/``ValueError`` (the
    admin's requeue and purge buttons too), and the job could not be cleared away."""
    requeued, purged = dead_job(), dead_job()
    plant(requeued, name)
    plant(purged, name)
    assert requeue(requeued.pk) is True
    assert requeued.pk in Job.objects.filter(status="scheduled").values_list("pk", flat=True)
    assert purge(purged.pk) is True
    assert not Job.objects.filter(pk=purged.pk).exists()
