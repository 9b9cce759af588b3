"""schedule / cancel / reschedule / cancel_for: the database is the judge, Redis follows."""

from __future__ import annotations

import datetime
import re
import time
import uuid
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.db import transaction
from django.dispatch import Signal
from django.utils import timezone

from django_delayjobs import cancel_for, cancel_on, delayable, schedule, signals
from django_delayjobs.connection import get_engine
from django_delayjobs.exceptions import AlreadyRunning, InvalidSchedule, NotDelayable
from django_delayjobs.models import EventKind, Job, JobEvent, Status, time_ordered_uuid
from tests.testapp import tasks
from tests.testapp.models import Pair, Sku, Thing, thing_paid

from .test_rest_helpers import snapshot

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
MS = datetime.timedelta(milliseconds=1)

pytestmark = pytest.mark.django_db(transaction=True)


def redis_state(job: Job) -> str | None:
    """Where the engine holds a job id, if anywhere."""
    engine, jid = get_engine(), str(job.pk)
    keys = engine.keys(job.queue)
    client = engine.client
    if client.zscore(keys.pending, jid) is not None:
        return "pending"
    if client.sismember(keys.ready_set, jid):
        return "ready"
    if client.zscore(keys.unack, jid) is not None:
        return "unack"
    if client.zscore(keys.garbage, jid) is not None:
        return "garbage"
    return None


@pytest.fixture
def thing():
    return Thing.objects.create(name="t")


def test_schedule_bound_method_writes_row_event_and_redis(thing):
    job = schedule(thing.expire, in_=datetime.timedelta(minutes=30))
    job.refresh_from_db()
    assert job.status == Status.SCHEDULED
    assert job.action == "testapp.Thing.expire"
    assert job.target == thing
    assert (timezone.now() + datetime.timedelta(minutes=29)) < job.run_at
    assert list(job.events.values_list("kind", "actor")) == [("scheduled", "code")]
    assert redis_state(job) == "pending"
    due = get_engine().client.zscore(get_engine().keys("default").pending, str(job.pk))
    assert due == (job.run_at - EPOCH) / MS  # to the microsecond


@pytest.mark.parametrize(
    ("micros", "score"), [(123_456, 1_893_456_000_123.456), (123_000, 1_893_456_000_123)]
)
def test_redis_holds_the_due_time_to_the_microsecond(thing, micros, score):
    """Rounded up to the ms, every job was promoted up to 1 ms late (0.5 ms on average);
    truncated, up to 1 ms before its run_at."""
    at = datetime.datetime(2030, 1, 1, 0, 0, 0, micros, tzinfo=datetime.UTC)
    job = schedule(thing.expire, at=at)
    due = get_engine().client.zscore(get_engine().keys("default").pending, str(job.pk))
    assert due == score
    assert get_engine().promote("default").next_due_ms == int(score)


def test_schedule_function_with_seconds_and_options(thing):
    job = schedule(
        tasks.record, in_=5, args=["x"], kwargs={"extra": 1}, queue="orders", key="k1",
        max_attempts=2, expires=datetime.timedelta(hours=1),
    )  # fmt: skip
    job.refresh_from_db()
    assert (job.action, job.queue, job.key, job.max_attempts) == (
        "tests.testapp.tasks.record", "orders", "k1", 2,
    )  # fmt: skip
    assert job.target is None
    assert job.expires_at == job.run_at + datetime.timedelta(hours=1)
    assert redis_state(job) == "pending"


def test_due_now_goes_straight_to_ready(thing):
    job = schedule(thing.touch, in_=0)
    assert redis_state(job) == "ready"


def test_rich_arguments_round_trip():
    from django_delayjobs.serialization import load

    values = [
        datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
        datetime.date(2026, 1, 2),
        Decimal("12.30"),
        uuid.UUID(int=7),
        {"nested": [1, 2.5, None, True, "s"]},
    ]
    job = schedule(tasks.echo, in_=60, args=values, kwargs={"when": values[0]})
    job = Job.objects.get(pk=job.pk)
    assert load(job.args) == values
    assert load(job.kwargs) == {"when": values[0]}
    assert type(load(job.args)[2]) is Decimal


def not_registered(x: int) -> None:
    pass


class Unsaved:
    pass


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda t: schedule(lambda: None, in_=1), NotDelayable, "lambda"),
        (lambda t: schedule(print, in_=1), NotDelayable, "not registered"),
        (lambda t: schedule(len, in_=1), NotDelayable, "not registered"),
        (lambda t: schedule(not_registered, in_=1), NotDelayable, "@delayable"),
        (lambda t: schedule(tasks.plain, in_=1, args=["x"]), NotDelayable, "@delayable"),
        (lambda t: schedule(t.not_delayable, in_=1), NotDelayable, "@delayable"),
        (lambda t: schedule(Thing.expire, in_=1), NotDelayable, "unbound"),
        (lambda t: schedule(Thing().expire, in_=1), ValueError, "unsaved"),
        (lambda t: schedule(t.touch, at=datetime.datetime(2030, 1, 1)), ValueError, "naive"),
        (lambda t: schedule(t.touch, at="2030-01-01"), TypeError, "datetime"),
        (lambda t: schedule(t.touch), TypeError, "exactly one"),
        (lambda t: schedule(t.touch, in_=1, at=timezone.now()), TypeError, "exactly one"),
        (lambda t: schedule(t.touch, in_=-1), ValueError, "non-negative"),
        (lambda t: schedule(t.touch, in_=float("nan")), ValueError, "finite"),
        (lambda t: schedule(t.touch, in_="10"), TypeError, "timedelta or a number"),
        (lambda t: schedule(t.touch, in_=True), TypeError, "timedelta or a number"),
        (lambda t: schedule(tasks.echo, in_=1, args=[object()]), TypeError, "cannot be stored"),
        (lambda t: schedule(tasks.echo, in_=1, args=[Unsaved()]), TypeError, "Unsaved"),
        (lambda t: schedule(tasks.echo, in_=1, kwargs={"t": t}), TypeError, "pk"),
        (lambda t: schedule(tasks.echo, in_=1, args=[{1: 2}]), TypeError, "keys must be str"),
        (lambda t: schedule(tasks.echo, in_=1, args=[float("inf")]), TypeError, "infinity"),
        (lambda t: schedule(tasks.echo, in_=1, args="abc"), TypeError, "list or tuple"),
        (lambda t: schedule(tasks.record, in_=1, args=[1, 2]), TypeError, "do not fit"),
        (lambda t: schedule(t.expire, in_=1, kwargs={"nope": 1}), TypeError, "do not fit"),
        (lambda t: schedule(t.touch, in_=1, queue=""), ValueError, "queue"),
        (lambda t: schedule(t.touch, in_=1, queue="a:b"), ValueError, "queue"),
        (lambda t: schedule(t.touch, in_=1, queue="{x}"), ValueError, "queue"),
        (lambda t: schedule(t.touch, in_=1, queue="a b"), ValueError, "queue"),
        (lambda t: schedule(t.touch, in_=1, queue=5), TypeError, "queue"),
        (lambda t: schedule(t.touch, in_=1, max_attempts=0), ValueError, "at least 1"),
        (lambda t: schedule(t.touch, in_=1, max_attempts=1.5), TypeError, "int"),
        (lambda t: schedule(t.touch, in_=1, key=""), TypeError, "key"),
        (lambda t: schedule(t.touch, in_=1, expires=-5), ValueError, "non-negative"),
        (lambda t: schedule(t.touch, in_=60, expires=timezone.now()), ValueError, "later than"),
    ],
)
def test_bad_input_raises_and_writes_nothing(thing, redis_client, call, error, message):
    with pytest.raises(error, match=message):
        call(thing)
    assert not Job.objects.exists()
    assert not JobEvent.objects.exists()
    assert redis_client.dbsize() == 0


def test_a_method_of_a_composite_primary_key_model_is_refused(redis_client):
    """A job names its target by one primary key value. Pair's pk (1, 2) was stored as
    "(1, 2)", which the worker could never look up: the job went dead."""
    pair = Pair.objects.create(a=1, b=2)
    with pytest.raises(NotDelayable, match="composite primary key"):
        schedule(pair.touch, in_=0)
    assert cancel_for(pair) == 0  # never raises inside a caller's transaction
    assert not Job.objects.exists()
    assert not JobEvent.objects.exists()
    assert redis_client.dbsize() == 0


def test_delayable_refuses_lambdas_and_nested_functions():
    with pytest.raises(NotDelayable):
        delayable(lambda: None)

    def inner() -> None:
        pass

    with pytest.raises(NotDelayable, match="module level"):
        delayable(inner)


def test_rolled_back_transaction_leaves_nothing(thing, redis_client):
    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        schedule(thing.expire, in_=60)
        raise Boom
    assert not Job.objects.exists()
    assert redis_client.dbsize() == 0


def test_redis_follows_on_commit_only(thing):
    with transaction.atomic():
        job = schedule(thing.expire, in_=60)
        assert redis_state(job) is None
    assert redis_state(job) == "pending"


def test_redis_down_at_commit_keeps_the_job_scheduled(thing, settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": "redis://127.0.0.1:1/0"}
    job = schedule(thing.expire, in_=60)
    assert Job.objects.get(pk=job.pk).status == Status.SCHEDULED


def test_key_returns_existing_active_job(thing):
    first = schedule(thing.expire, in_=60, key="order-1")
    second = schedule(thing.expire, in_=120, key="order-1")
    assert second.pk == first.pk
    assert Job.objects.count() == 1
    # Another queue is another namespace.
    other = schedule(thing.expire, in_=60, key="order-1", queue="other")
    assert other.pk != first.pk


def test_key_replace_cancels_the_waiting_job(thing):
    first = schedule(thing.expire, in_=60, key="order-1")
    second = schedule(thing.expire, in_=120, key="order-1", replace=True)
    assert second.pk != first.pk
    first.refresh_from_db()
    assert first.status == Status.CANCELLED
    assert redis_state(first) is None
    assert redis_state(second) == "pending"


def test_key_is_free_again_after_the_job_finished(thing):
    first = schedule(thing.expire, in_=60, key="order-1")
    assert first.cancel()
    second = schedule(thing.expire, in_=60, key="order-1")
    assert second.pk != first.pk


def test_cancel_wins_once_and_removes_from_redis(thing):
    job = schedule(thing.expire, in_=60)
    assert job.cancel() is True
    assert job.cancel() is False
    job.refresh_from_db()
    assert job.status == Status.CANCELLED and job.finished_at is not None
    assert redis_state(job) is None
    assert list(job.events.values_list("kind", flat=True)) == ["scheduled", "cancelled"]


def test_cancel_after_promotion_removes_from_ready(thing):
    job = schedule(thing.expire, in_=0)
    assert redis_state(job) == "ready"
    assert job.cancel()
    assert redis_state(job) is None


def test_cancel_loses_against_a_running_or_finished_job(thing):
    job = schedule(thing.expire, in_=60)
    for status in (Status.RUNNING, Status.SUCCEEDED, Status.DEAD, Status.SKIPPED):
        Job.objects.filter(pk=job.pk).update(status=status)
        assert job.cancel() is False
        assert Job.objects.get(pk=job.pk).status == status


def test_cancel_inside_rolled_back_transaction_changes_nothing(thing):
    job = schedule(thing.expire, in_=60)
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        assert job.cancel()
        1 / 0  # noqa: B018
    assert Job.objects.get(pk=job.pk).status == Status.SCHEDULED
    assert redis_state(job) == "pending"


def test_reschedule_moves_due_time_in_db_and_redis(thing):
    job = schedule(thing.expire, in_=60)
    assert job.reschedule(in_=600)
    job.refresh_from_db()
    due = get_engine().client.zscore(get_engine().keys("default").pending, str(job.pk))
    assert due == (job.run_at - EPOCH) / MS  # to the microsecond
    assert job.events.filter(kind=EventKind.RESCHEDULED).count() == 1


def test_reschedule_after_the_job_fired_returns_false(thing):
    job = schedule(thing.expire, in_=60)
    Job.objects.filter(pk=job.pk).update(status=Status.SUCCEEDED)
    assert job.reschedule(in_=5) is False
    assert redis_state(job) == "pending"  # untouched: the worker would drop it
    assert not job.events.filter(kind=EventKind.RESCHEDULED).exists()


def test_reschedule_validates_input(thing):
    job = schedule(thing.expire, in_=60, expires=datetime.timedelta(minutes=5))
    with pytest.raises(TypeError):
        job.reschedule()
    with pytest.raises(ValueError, match="naive"):
        job.reschedule(at=datetime.datetime(2031, 1, 1))
    with pytest.raises(InvalidSchedule, match="expires"):
        job.reschedule(in_=3600)


def test_reschedule_to_the_expiry_itself_is_refused(thing):
    """schedule() refuses expires_at == run_at ("must be later"), but reschedule() takes a
    due time equal to the job's expiry: the job can then never run (the worker finds it
    expired and skips it)."""
    at = timezone.now() + datetime.timedelta(hours=1)
    job = schedule(thing.touch, at=at, expires=datetime.timedelta(minutes=5))
    before = snapshot(job)
    with pytest.raises(InvalidSchedule, match="expires"):
        job.reschedule(at=job.expires_at)
    assert snapshot(job) == before


def test_cancel_for_cancels_only_that_objects_waiting_jobs(thing):
    other = Thing.objects.create()
    a = schedule(thing.expire, in_=60)
    b = schedule(thing.touch, in_=60)
    c = schedule(other.expire, in_=60)
    d = schedule(tasks.record, in_=60, args=["x"])
    assert cancel_for(thing, Thing.expire) == 1
    assert cancel_for(thing) == 1
    assert cancel_for(thing) == 0
    statuses = {j.pk: j.status for j in Job.objects.all()}
    assert statuses == {
        a.pk: Status.CANCELLED, b.pk: Status.CANCELLED,
        c.pk: Status.SCHEDULED, d.pk: Status.SCHEDULED,
    }  # fmt: skip
    with pytest.raises(ValueError, match="not saved"):
        cancel_for(Thing())


def test_cancel_for_refuses_what_is_not_a_model_instance():
    """cancel_for(42) raises AttributeError ('int' has no attribute 'pk'), not TypeError."""
    with pytest.raises(TypeError, match="model instance"):
        cancel_for(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("action", ["testapp.Thing.touch\x00", "testapp.Thing.\ud800"])
def test_cancel_for_refuses_an_action_name_no_job_can_hold(thing, action):
    """An action name with NUL or a lone surrogate reaches the database: a UnicodeEncodeError
    (SQLite, PostgreSQL) or a DataError that aborts the caller's transaction (PostgreSQL),
    or on SQLite a NUL passes unnoticed; it must be InvalidSchedule, before any query."""
    job = schedule(thing.touch, in_=60)
    with transaction.atomic():
        with pytest.raises(InvalidSchedule):
            cancel_for(thing, action)
        assert Job.objects.get(pk=job.pk).status == Status.SCHEDULED  # still usable


def test_cancel_for_refuses_a_bad_actor_even_when_no_job_matches(thing):
    """cancel_for(obj, actor="\x00") returns 0 when no job is waiting, and raises only when
    one is: the actor is checked per job, not at the entry point."""
    with pytest.raises(InvalidSchedule, match="NUL"):
        cancel_for(thing, actor="\x00")
    with pytest.raises(InvalidSchedule, match="150"):
        cancel_for(thing, actor="a" * 151)


@pytest.mark.parametrize("pk", ["a\ud800", "a\x00"])
def test_cancel_for_an_object_whose_pk_no_job_can_hold_cancels_nothing(pk):
    """A primary key with a lone surrogate or a NUL (an instance built with it, never
    saved on PostgreSQL) is sent to the database, which raises UnicodeEncodeError or
    DataError (PostgreSQL, aborting the caller's transaction); no job can target it: 0."""
    Sku.objects.create(code="a")
    with transaction.atomic():
        assert cancel_for(Sku(code=pk)) == 0
        assert Sku.objects.count() == 1  # the transaction is still usable


def test_cancel_on_signal_cancels_inside_the_senders_transaction(thing):
    cancel_on(thing_paid, Thing.expire, sender=Thing, name="thing_paid")
    job = schedule(thing.expire, in_=60)
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        thing.pay()
        1 / 0  # noqa: B018
    assert Job.objects.get(pk=job.pk).status == Status.SCHEDULED
    thing.pay()
    job.refresh_from_db()
    assert job.status == Status.CANCELLED
    assert job.events.get(kind=EventKind.CANCELLED).actor == "signal:thing_paid"


def test_cancel_on_refuses_a_name_whose_actor_does_not_fit_when_connecting(thing):
    """The actor 'signal:' + name must fit JobEvent.actor (150): refused by cancel_on()
    itself, not when the signal fires inside the sender's transaction."""
    paid = Signal()  # a signal of this test's own: nothing else is connected to it
    with pytest.raises(InvalidSchedule, match="at most 150"):
        cancel_on(paid, Thing.expire, sender=Thing, name="n" * 150)
    with pytest.raises(InvalidSchedule, match="NUL"):
        cancel_on(paid, Thing.expire, sender=Thing, name="\x00")
    assert not paid.has_listeners(Thing)
    cancel_on(paid, Thing.expire, sender=Thing, name="n" * 143)  # 150 with 'signal:'
    job = schedule(thing.expire, in_=60)
    paid.send(sender=Thing, instance=thing)
    assert job.events.get(kind=EventKind.CANCELLED).actor == "signal:" + "n" * 143


def test_cancel_on_refuses_an_action_it_could_not_cancel_when_connecting(thing):
    """An action name with a NUL or a lone surrogate, or a callable that is not a
    registered action, was only refused when the signal fired: inside the sender's
    transaction, which the error then rolled back (the payment with it)."""
    paid = Signal()
    for action in ("testapp.Thing.expire\x00", "testapp.Thing.\ud800", tasks.plain, print):
        with pytest.raises((TypeError, InvalidSchedule)):
            cancel_on(paid, action, sender=Thing, name="paid")
    assert not paid.has_listeners(Thing)


def test_cancel_on_returns_a_receiver_that_disconnects_and_honours_each_options(thing):
    """cancel_on "returns the receiver": signal.disconnect(receiver) left it connected
    (it was connected under a dispatch_uid), and a second cancel_on for the same signal,
    action and sender with another name or fail_if_running was silently not connected."""
    paid = Signal()
    plain = cancel_on(paid, Thing.expire, sender=Thing, name="paid")
    assert cancel_on(paid, Thing.expire, sender=Thing, name="paid") is plain  # ready() twice
    strict = cancel_on(paid, Thing.expire, sender=Thing, name="paid", fail_if_running=True)
    running = schedule(thing.expire, in_=60)
    Job.objects.filter(pk=running.pk).update(status=Status.RUNNING)
    with pytest.raises(AlreadyRunning), transaction.atomic():
        paid.send(sender=Thing, instance=thing)
    assert paid.disconnect(strict, sender=Thing)
    assert paid.disconnect(plain, sender=Thing)
    assert not paid.has_listeners(Thing)


def test_cancel_for_can_refuse_when_the_job_already_runs(thing):
    waiting = schedule(thing.touch, in_=60)
    running = schedule(thing.expire, in_=60)
    Job.objects.filter(pk=running.pk).update(status=Status.RUNNING)
    with pytest.raises(AlreadyRunning, match=r"testapp\.Thing\.expire"), transaction.atomic():
        cancel_for(thing, fail_if_running=True)
    # the exception rolled the whole transaction back, the waiting job's cancel included
    assert Job.objects.get(pk=waiting.pk).status == Status.SCHEDULED
    assert cancel_for(thing, Thing.touch, fail_if_running=True) == 1


def test_cancel_for_refuses_a_method_of_another_model(thing):
    """cancel_for(thing, Sku.touch) named the action 'testapp.Thing.touch' from the
    object's model and the method's name alone: it cancelled thing's Thing.touch jobs,
    which the caller did not name."""
    job = schedule(thing.touch, in_=60)
    with pytest.raises(TypeError, match="Sku"):
        cancel_for(thing, Sku.touch)
    assert Job.objects.get(pk=job.pk).status == Status.SCHEDULED
    assert cancel_for(thing, Thing.touch) == 1
    # cancel_on's sender need not be the instance's model (sender=Invoice, order=...):
    # its receiver refuses a wrong pair when the signal fires
    again = schedule(thing.touch, in_=60)
    paid = Signal()
    cancel_on(paid, Sku.touch, sender=Thing)
    with pytest.raises(TypeError, match="Sku"):
        paid.send(sender=Thing, instance=thing)
    assert Job.objects.get(pk=again.pk).status == Status.SCHEDULED


def test_cancel_for_that_refuses_cancels_nothing_outside_a_transaction(thing):
    """cancel_for(fail_if_running=True) cancelled the waiting jobs (each in its own commit,
    job_cancelled sent) and then raised AlreadyRunning: outside a caller's transaction
    nothing rolled the cancels back, so a refused call had changed jobs."""
    waiting = schedule(thing.touch, in_=60)
    running = schedule(thing.expire, in_=60)
    Job.objects.filter(pk=running.pk).update(status=Status.RUNNING)
    seen: list[Job] = []

    def on_cancelled(sender, job, **kwargs):
        seen.append(job)

    signals.job_cancelled.connect(on_cancelled)
    try:
        with pytest.raises(AlreadyRunning):
            cancel_for(thing, fail_if_running=True)
    finally:
        signals.job_cancelled.disconnect(on_cancelled)
    assert Job.objects.get(pk=waiting.pk).status == Status.SCHEDULED
    assert seen == []


def test_signals_are_sent_after_commit(thing):
    from django_delayjobs import signals

    seen: list[tuple[str, Job]] = []

    def on_scheduled(sender, job, **kwargs):
        seen.append(("scheduled", job))

    def on_cancelled(sender, job, **kwargs):
        seen.append(("cancelled", job))

    signals.job_scheduled.connect(on_scheduled)
    signals.job_cancelled.connect(on_cancelled)
    try:
        with transaction.atomic():
            job = schedule(thing.expire, in_=60)
            assert seen == []
        job.cancel()
    finally:
        signals.job_scheduled.disconnect(on_scheduled)
        signals.job_cancelled.disconnect(on_cancelled)
    assert [kind for kind, _ in seen] == ["scheduled", "cancelled"]


def test_requeue_of_a_dead_job_whose_key_another_job_holds_now_is_refused():
    """Only active jobs hold a key, so a new job may take a dead job's key. Requeueing the
    dead one would then make two active jobs with one key: ``InvalidSchedule`` names the
    holder (the database's IntegrityError escaped before), and both jobs stay as they are."""
    dead = schedule(tasks.fail, in_=0, key="order-1-autocancel", max_attempts=1)
    call_command("run_delayworker", "--burst", "-v", "0")
    assert Job.objects.get(pk=dead.pk).status == Status.DEAD
    fresh = schedule(tasks.record, in_=60, args=["x"], key="order-1-autocancel")
    with pytest.raises(InvalidSchedule, match=f"job {fresh.pk} holds the key 'order-1-autocancel'"):
        dead.requeue()
    assert Job.objects.get(pk=dead.pk).status == Status.DEAD
    assert Job.objects.get(pk=fresh.pk).status == Status.SCHEDULED
    assert list(dead.events.values_list("kind", flat=True)) == ["scheduled", "started", "failed",
                                                                "dead"]  # fmt: skip


def test_requeue_of_a_dead_job_past_its_expiry_is_refused():
    """A dead job whose expiry has passed would be skipped by the first worker to take it
    (``skipped``, the action never called) while ``requeue`` said it was revived: it is
    refused as ``reschedule`` refuses a due time past the expiry, and stays dead."""
    dead = schedule(tasks.fail, in_=0, expires=datetime.timedelta(hours=1), max_attempts=1)
    call_command("run_delayworker", "--burst", "-v", "0")
    past = timezone.now() - datetime.timedelta(seconds=1)
    Job.objects.filter(pk=dead.pk).update(expires_at=past)  # an hour went by
    refusal = f"the job expired at {past.isoformat()}: it would be skipped at once"
    with pytest.raises(InvalidSchedule, match=re.escape(refusal)):
        dead.requeue()
    assert Job.objects.get(pk=dead.pk).status == Status.DEAD
    assert dead.events.filter(kind=EventKind.REQUEUED).count() == 0
    # one that has not expired yet is requeued as ever
    Job.objects.filter(pk=dead.pk).update(expires_at=past + datetime.timedelta(hours=1))
    assert dead.requeue() is True
    assert Job.objects.get(pk=dead.pk).status == Status.SCHEDULED


def test_cancel_of_a_row_whose_queue_names_no_redis_key_runs_the_later_commit_hooks():
    """A row that did not pass the door can be cancelled (docs/scheduling.md). Its
    on-commit Redis hook fails on the queue name; the failure is logged, not raised out of
    the caller's ``atomic()`` after the commit, where Django would skip the transaction's
    later hooks (the caller's own, ``job_cancelled``)."""
    job = schedule(tasks.record, in_=60, args=["poison"])
    Job.objects.filter(pk=job.pk).update(queue="old queue")  # an older version's
    ran: list[str] = []

    def cancelled(sender, job, **kwargs):
        ran.append("job_cancelled")

    signals.job_cancelled.connect(cancelled, weak=False, dispatch_uid="audit-cancelled")
    try:
        with transaction.atomic():
            won = Job.objects.get(pk=job.pk).cancel()
            transaction.on_commit(lambda: ran.append("caller's hook"))
    finally:
        signals.job_cancelled.disconnect(dispatch_uid="audit-cancelled")
    assert won is True
    assert Job.objects.get(pk=job.pk).status == Status.CANCELLED
    assert sorted(ran) == ["caller's hook", "job_cancelled"]


def test_cancel_through_an_old_copy_of_the_job_records_the_rows_attempt():
    """The usual code keeps the Job that ``schedule()`` returned and cancels it later, when
    an attempt may have failed meanwhile: the event carries the row's attempt (1), not the
    copy's (0). A reschedule through an old copy says the due time it replaced."""
    job = schedule(tasks.fail, in_=0, max_attempts=3)
    call_command("run_delayworker", "--burst", "-v", "0")
    assert Job.objects.get(pk=job.pk).status == Status.RETRYING
    copy = Job.objects.get(pk=job.pk)
    moved_to = copy.run_at + datetime.timedelta(hours=1)
    assert copy.reschedule(at=moved_to) is True
    assert job.reschedule(at=moved_to + datetime.timedelta(hours=1)) is True  # the old copy
    assert job.cancel() is True
    history = list(job.events.values_list("kind", "attempt", "message"))
    assert [(kind, attempt) for kind, attempt, _ in history] == [
        ("scheduled", 0), ("started", 1), ("failed", 1), ("rescheduled", 1), ("rescheduled", 1),
        ("cancelled", 1),
    ]  # fmt: skip
    assert history[4][2].startswith(f"from {moved_to.isoformat()} to ")


def test_public_api_imports_without_models():
    import subprocess
    import sys

    code = (
        "import django_delayjobs, sys; "
        "assert 'django_delayjobs.models' not in sys.modules; "
        "print(sorted(django_delayjobs.__all__))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "schedule" in out.stdout


def test_job_ids_are_uuids_of_version_7_in_the_order_they_were_made():
    """Time-ordered ids (RFC 9562): the ms they were made, then 74 random bits."""
    before = time.time_ns() // 1_000_000
    first = schedule(tasks.record, in_=60, args=["a"])
    time.sleep(0.002)
    second = schedule(tasks.record, in_=60, args=["b"])
    after = time.time_ns() // 1_000_000
    for job in (first, second):
        assert job.pk.version == 7 and job.pk.variant == uuid.RFC_4122
        assert before <= job.pk.int >> 80 <= after
    assert first.pk < second.pk
    assert list(Job.objects.order_by("pk").values_list("pk", flat=True)) == [first.pk, second.pk]
    many = {time_ordered_uuid() for _ in range(100_000)}  # most within the same ms
    assert len(many) == 100_000
