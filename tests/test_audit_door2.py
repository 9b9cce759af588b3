"""The lifecycle's entry points and outcomes, second door audit: a failed attempt whose
retry would come after the job's expiry, and ``cancel``/``reschedule`` given a stale Job
instance. A real Redis and a real worker (--burst in this process) throughout."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from django.core.management import call_command

from django_delayjobs import schedule, signals
from django_delayjobs.connection import get_engine
from django_delayjobs.exceptions import InvalidSchedule
from django_delayjobs.models import Job, Status
from django_delayjobs.services import purge, requeue
from django_delayjobs.timing import to_ms
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True)


def burst() -> None:
    call_command("run_delayworker", "--burst", "-v", "0")


def history(job: Job) -> list[str]:
    return list(job.events.order_by("at", "id").values_list("kind", flat=True))


@pytest.fixture
def sent() -> Iterator[list[str]]:
    """The names of the outcome signals sent, in order."""
    names: list[str] = []

    def receiver(name: str) -> Callable[..., None]:
        return lambda sender, job, **kwargs: names.append(name)

    receivers = {signals.job_failed: receiver("failed"), signals.job_dead: receiver("dead")}
    for signal, receiver in receivers.items():
        signal.connect(receiver, weak=False)
    yield names
    for signal, receiver in receivers.items():
        signal.disconnect(receiver)


# -- a retry that would come too late -------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "args"),
    [(tasks.fail, []), (tasks.retry_later, [120, "never"])],
    ids=["backoff", "retry-after"],
)
def test_a_failed_attempt_whose_retry_is_due_after_the_expiry_is_skipped_at_once(
    settings, sent, action, args
):
    """The next attempt would be due 30-60 s (the backoff) or 120 s (``Retry(after=)``)
    on, the job expires in 20 s: it is settled ``skipped`` with the failed attempt, in
    the same transaction, and its id leaves Redis; not put back in ``pending`` to be
    claimed once more only to be skipped then (a history of "retrying", then "skipped")."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "RETRY_BACKOFF_SECONDS": 60}
    job = schedule(action, in_=0, args=args, max_attempts=3, expires=timedelta(seconds=20))
    burst()
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.SKIPPED, 1)
    assert job.finished_at is not None
    assert history(job) == ["scheduled", "started", "failed", "skipped"]
    skipped = job.events.get(kind="skipped").message
    assert skipped.startswith(f"expires at {job.expires_at.isoformat()}, before")
    assert job.last_error == job.events.get(kind="failed").message  # the failure, to debug
    assert sent == ["failed"]  # an attempt failed; the job is not dead
    stats = get_engine().stats("default")
    assert (stats.pending, stats.ready, stats.in_flight, stats.garbage) == (0, 0, 0, 0)


def test_a_failed_attempt_whose_retry_is_due_before_the_expiry_is_retried(settings, sent):
    """The other side of the line: the retry (at most 20 s on) is due before the expiry."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "RETRY_BACKOFF_SECONDS": 20}
    job = schedule(tasks.fail, in_=0, max_attempts=3, expires=timedelta(minutes=1))
    burst()
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.RETRYING, 1)
    assert job.run_at < job.expires_at
    assert history(job) == ["scheduled", "started", "failed"]
    assert sent == ["failed"]
    assert get_engine().stats("default").pending == 1


# -- cancel, reschedule and purge given a stale Job instance ---------------------------------


def stale_copies(job: Job) -> list[Job]:
    """Copies of ``job`` that disagree with its row: one a caller changed, and one built
    from the id alone (``Job(pk=...)``: no queue, no priority, no expiry)."""
    changed = Job.objects.get(pk=job.pk)
    changed.queue, changed.priority, changed.expires_at = "default", -5, None
    return [changed, Job(pk=job.pk)]


def where(job: Job) -> dict[str, tuple[str, float | None]]:
    """The keys of the queues ``orders`` and ``default`` that hold ``job``'s id, with its score."""
    engine = get_engine()
    found = {}
    for queue in ("orders", "default"):
        keys = engine.keys(queue)
        for name in ("pending", "garbage"):
            score = engine.client.zscore(getattr(keys, name), str(job.pk))
            if score is not None:
                found[f"{queue}:{name}"] = (name, score)
    return found


@pytest.mark.parametrize("copy", [0, 1], ids=["changed", "bare"])
def test_cancel_of_a_stale_instance_removes_the_id_from_its_rows_queue(copy):
    job = schedule(tasks.record, in_=3600, args=["x"], queue="orders", priority=3)
    assert list(where(job)) == ["orders:pending"]
    assert stale_copies(job)[copy].cancel() is True
    assert Job.objects.get(pk=job.pk).status == Status.CANCELLED
    assert where(job) == {}  # not left pending in "orders" for a worker to claim and drop


@pytest.mark.parametrize("copy", [0, 1], ids=["changed", "bare"])
def test_reschedule_of_a_stale_instance_moves_the_id_in_its_rows_queue(copy):
    job = schedule(tasks.record, in_=3600, args=["x"], queue="orders", priority=3)
    assert stale_copies(job)[copy].reschedule(in_=60) is True
    row = Job.objects.get(pk=job.pk)
    assert where(job) == {"orders:pending": ("pending", to_ms(row.run_at))}  # one copy, moved
    engine = get_engine()
    assert engine.client.hget(engine.keys("orders").priority, str(job.pk)) == b"3"


@pytest.mark.parametrize("copy", [0, 1], ids=["changed", "bare"])
def test_reschedule_of_a_stale_instance_checks_the_rows_expiry(copy):
    job = schedule(tasks.record, in_=60, args=["x"], queue="orders", expires=timedelta(minutes=5))
    with pytest.raises(InvalidSchedule, match="must be later than the due time"):
        stale_copies(job)[copy].reschedule(in_=3600)  # past its expiry: it would never run
    assert Job.objects.get(pk=job.pk).run_at == job.run_at


@pytest.mark.parametrize("copy", [0, 1], ids=["changed", "bare"])
def test_purge_of_a_stale_instance_removes_the_id_from_its_rows_garbage(copy):
    job = schedule(tasks.fail, in_=0, queue="orders", max_attempts=1)
    call_command("run_delayworker", "--burst", "--queues", "orders", "-v", "0")
    assert Job.objects.get(pk=job.pk).status == Status.DEAD
    assert list(where(job)) == ["orders:garbage"]
    assert purge(stale_copies(job)[copy]) is True
    assert where(job) == {}


# -- an expiry that is merely short ---------------------------------------------------------


def test_an_expiry_a_microsecond_after_the_due_time_is_accepted_and_skipped_visibly():
    """No margin is added to ``expires`` (docs/scheduling.md): a window too short to be
    met is the caller's choice, and ends ``skipped`` with its reason, not run."""
    job = schedule(tasks.record, in_=0, args=["x"], expires=timedelta(microseconds=1))
    assert job.expires_at - job.run_at == timedelta(microseconds=1)
    burst()
    job.refresh_from_db()
    assert job.status == Status.SKIPPED
    assert job.events.get(kind="skipped").message == f"expired at {job.expires_at.isoformat()}"
    assert not Record.objects.exists()


@pytest.mark.parametrize("copy", [0, 1], ids=["changed", "bare"])
def test_requeue_of_a_stale_instance_checks_the_rows_attempts(copy):
    """The row's attempts plus the ones given must fit the column (2**31 - 1); a copy that
    says fewer attempts than the row must not let the UPDATE overflow it (PostgreSQL's
    ``DataError``, or on SQLite a ``max_attempts`` past what ``schedule`` accepts)."""
    job = schedule(tasks.fail, in_=0, queue="orders", max_attempts=1)
    call_command("run_delayworker", "--burst", "--queues", "orders", "-v", "0")
    copy_ = stale_copies(job)[copy]
    copy_.attempts = 0
    with pytest.raises(InvalidSchedule, match=r"1 \+ 2147483647 attempts exceed 2147483647"):
        requeue(copy_, attempts=2**31 - 1)
    assert Job.objects.get(pk=job.pk).max_attempts == 1
    assert requeue(copy_, attempts=2**31 - 2) is True
    assert Job.objects.get(pk=job.pk).max_attempts == 2**31 - 1


@pytest.mark.parametrize("copy", [0, 1], ids=["changed", "bare"])
def test_requeue_of_a_stale_instance_names_the_job_holding_the_rows_key(copy):
    job = schedule(tasks.fail, in_=0, queue="orders", key="order-1", max_attempts=1)
    call_command("run_delayworker", "--burst", "--queues", "orders", "-v", "0")
    holder = schedule(tasks.record, in_=3600, args=["x"], queue="orders", key="order-1")
    copy_ = stale_copies(job)[copy]
    copy_.key = None
    with pytest.raises(InvalidSchedule, match=f"job {holder.pk} holds the key 'order-1' now"):
        requeue(copy_)  # not the key constraint's IntegrityError
    assert Job.objects.get(pk=job.pk).status == Status.DEAD
