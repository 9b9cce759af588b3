"""Audit of ``reschedule()`` against itself and a cancel: changes that commit in the order
of the row's lock, and whose on-commit Redis calls reach Redis in the other order.

The order is forced by holding the first call's on-commit ``push`` (the real one, to the
real Redis) until the second call is done. Run on SQLite, and on PostgreSQL with
DATABASE_URL set.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from django_delayjobs import schedule, services
from django_delayjobs.models import Job, Status
from django_delayjobs.timing import to_ms
from tests.helpers import database_down, free_port, in_thread
from tests.test_rest_helpers import due_in_redis, redis_state
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


class Held:
    """``services.push`` wrapped so that the first push of the thread named ``first``
    waits until ``release`` is set (its call has committed: a push runs on commit)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.committed, self.release = threading.Event(), threading.Event()
        real = services.push

        def push(jobs: Iterable[Any]) -> int:
            if threading.current_thread().name == "first" and not self.committed.is_set():
                self.committed.set()
                assert self.release.wait(30), "the second call never came"
            return real(jobs)

        monkeypatch.setattr(services, "push", push)

    @contextlib.contextmanager
    def first(self, fn: Callable[[], Any]) -> Iterator[list[Any]]:
        """Run ``fn`` in a thread named ``first`` until its push is held; within: the
        second call; after: its push is let through and the thread joined."""
        out: list[Any] = []
        thread = in_thread(fn, out, "first")
        try:
            assert self.committed.wait(30), "the first call never committed"
            yield out
        finally:
            self.release.set()
            thread.join(30)


def _at(minutes: float) -> datetime:
    return timezone.now() + timedelta(minutes=minutes)


@pytest.mark.parametrize("first_due", [120, 5], ids=["older-later", "older-sooner"])
def test_reschedules_whose_pushes_reach_redis_in_the_other_order_leave_the_last_due_time(
    monkeypatch, first_due
):
    """The first reschedule commits, the second commits and pushes, then the first's push
    arrives: Redis held the first's due time while the row holds the second's. Later, the
    job ran late until reconcile (RECONCILE_SECONDS), which only moves an id earlier;
    sooner, it was handed out early and the worker deferred it."""
    job = schedule(tasks.record, in_=3600, args=["x"])
    held = Held(monkeypatch)
    with held.first(lambda: services.reschedule(job.pk, at=_at(first_due))) as first:
        assert services.reschedule(job.pk, at=_at(30)) is True
    assert first == [True]
    row = Job.objects.get(pk=job.pk)
    assert abs(row.run_at - _at(30)) < timedelta(minutes=1)  # the second's, committed last
    assert due_in_redis(job) == to_ms(row.run_at)


def test_a_reschedule_whose_push_arrives_after_a_cancel_leaves_nothing_in_redis(monkeypatch):
    """The reschedule commits, a cancel commits and removes the id, then the reschedule's
    push adds it again: a cancelled job's id sat in pending until its due time (counted
    pending, shown as the queue's next due), when a worker's claim found it cancelled."""
    job = schedule(tasks.record, in_=3600, args=["x"])
    held = Held(monkeypatch)
    with held.first(lambda: services.reschedule(job.pk, in_=600)) as first:
        assert services.cancel(job.pk) is True
        assert redis_state(job) is None
    assert first == [True]
    assert Job.objects.get(pk=job.pk).status == Status.CANCELLED
    assert redis_state(job) is None


def test_a_reschedule_whose_read_back_fails_leaves_redis_to_reconcile(
    monkeypatch, tmp_path, caplog
):
    """The database goes away between the commit and the read of the row after the push:
    the reschedule still returns True (an on-commit hook that raised would reach the
    caller, whose change committed), says so, and Redis holds the time it was given."""
    job = schedule(tasks.record, in_=3600, args=["x"])
    real, down = services.push, contextlib.ExitStack()

    def push(jobs: Iterable[Any]) -> int:
        added = real(jobs)
        down.enter_context(database_down(tmp_path))
        return added

    monkeypatch.setattr(services, "push", push)
    with down, caplog.at_level("WARNING", "django_delayjobs"):
        assert services.reschedule(job.pk, in_=600) is True
    assert "could not read it back" in caplog.text
    assert due_in_redis(job) == to_ms(Job.objects.get(pk=job.pk).run_at)


def test_a_reschedule_with_redis_unreachable_pushes_once(settings):
    """Its push fails (logged, left to reconcile); the row read back after it holds the
    time pushed, so nothing more is pushed: one Redis timeout per reschedule, not two."""
    job = schedule(tasks.record, in_=3600, args=["x"])
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    with override_settings(DELAYJOBS={**settings.DELAYJOBS, "REDIS_URL": nowhere}):
        calls: list[int] = []
        real = services.push
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(services, "push", lambda jobs: calls.append(1) or real(jobs))
            assert services.reschedule(job.pk, in_=600) is True
    assert calls == [1]
