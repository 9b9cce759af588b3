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
from django_delayjobs.models import Job, Status
from tests.testapp import tasks

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
