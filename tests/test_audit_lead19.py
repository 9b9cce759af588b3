"""Audit: a requeued task sent no ``task_enqueued``, though it goes back to READY and
starts and finishes again; and callers sharing a failing health-check run all raised the
one exception object, each raise adding its frames to its traceback, concurrently."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.core.management import call_command
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from django_delayjobs import health
from django_delayjobs.backends import TaskResultStatus
from django_delayjobs.engine.errors import PartlyUnavailable
from django_delayjobs.exceptions import DelayJobsError
from django_delayjobs.models import Job, Status
from django_delayjobs.services import requeue, schedule
from tests.testapp import task_functions as t
from tests.testapp import tasks
from tests.testapp.backends import SubclassBackend

try:
    from django.tasks import signals as task_signals
except ImportError:
    from django_tasks import signals as task_signals

pytestmark = pytest.mark.django_db(transaction=True)

BACKEND = "django_delayjobs.backends.DelayJobsBackend"
SUBCLASS = "tests.testapp.backends.SubclassBackend"


def burst() -> None:
    call_command("run_delayworker", "--burst", "--queues", "default,other", "-v", "0")


class Seen:
    """The framework's signals received, as (name, sender, status, id)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Any, str, str]] = []
        self.receivers = {name: self.on(name) for name in
                          ("task_enqueued", "task_started", "task_finished")}  # fmt: skip

    def on(self, name: str) -> Any:
        def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
            self.seen.append((name, sender, str(task_result.status), task_result.id))

        return receiver

    def __enter__(self) -> Seen:
        for name, receiver in self.receivers.items():
            getattr(task_signals, name).connect(receiver)
        return self

    def __exit__(self, *exc: object) -> None:
        for name, receiver in self.receivers.items():
            getattr(task_signals, name).disconnect(receiver)


def dead_task(task: Any = t.explode) -> str:
    result = task.enqueue("bad input")
    burst()
    assert Job.objects.get(pk=result.id).status == Status.DEAD
    return result.id


QUEUES = ["default", "other"]


@override_settings(TASKS={"default": {"BACKEND": BACKEND, "QUEUES": QUEUES},
                          "own": {"BACKEND": SUBCLASS, "QUEUES": QUEUES}})  # fmt: skip
def test_a_requeued_task_is_enqueued_again_then_starts_and_finishes_again():
    """Sent by the class of the backend that enqueued the task (a project's subclass here,
    not the ``DelayJobsBackend`` of an alias that is gone)."""
    job_id = dead_task(t.explode.using(backend="own"))
    with Seen() as s:
        assert requeue(job_id, actor="admin:1")
        assert s.seen == [("task_enqueued", SubclassBackend, "READY", job_id)]
        burst()
    assert [name for name, *_ in s.seen] == ["task_enqueued", "task_started", "task_finished"]
    assert {sender for _, sender, *_ in s.seen} == {SubclassBackend}
    assert s.seen[-1][2] == TaskResultStatus.FAILED


def test_a_requeue_in_a_transaction_rolled_back_sends_nothing():
    job_id = dead_task()
    with Seen() as s, pytest.raises(ZeroDivisionError), transaction.atomic():
        assert requeue(job_id)
        1 / 0  # noqa: B018
    assert s.seen == []
    assert Job.objects.get(pk=job_id).status == Status.DEAD


def test_job_requeue_sends_it_too_after_the_commit():
    job_id = dead_task()
    with Seen() as s:
        with transaction.atomic():
            assert Job.objects.get(pk=job_id).requeue()
            assert s.seen == []  # not before the requeue commits
        assert [name for name, *_ in s.seen] == ["task_enqueued"]


def test_a_requeue_not_won_or_refused_sends_nothing():
    job_id = dead_task()
    assert requeue(job_id)
    with Seen() as s:
        assert not requeue(job_id)  # not dead any more: nothing requeued
    assert s.seen == []


def test_a_raising_receiver_of_a_requeue_is_logged_not_raised(caplog):
    job_id = dead_task()

    def boom(**kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    task_signals.task_enqueued.connect(boom)
    try:
        assert requeue(job_id)
    finally:
        task_signals.task_enqueued.disconnect(boom)
    assert "receiver bug" in caplog.text
    assert Job.objects.get(pk=job_id).status == Status.SCHEDULED


def test_a_plain_job_requeued_sends_no_task_signal():
    job = schedule(tasks.fail, at=timezone.now(), max_attempts=1)
    burst()
    assert Job.objects.get(pk=job.pk).status == Status.DEAD
    with Seen() as s:
        assert requeue(job.pk)
    assert s.seen == []


def test_callers_sharing_a_failing_run_each_raise_their_own_exception(monkeypatch, settings):
    """Four callers share one run whose engine the settings cannot give: each raises the
    same type, with the run's exception as its cause, and no two raise the same object."""
    callers = 4
    unbounded = health._unbounded_from_settings
    runs: list[int] = []

    def when_all_joined(limits: health.Limits) -> list[health.Check]:
        runs.append(1)
        deadline = time.monotonic() + 10
        while health._latest.callers < callers and time.monotonic() < deadline:
            time.sleep(0.01)
        return unbounded(limits)

    monkeypatch.setattr(health, "_unbounded_from_settings", when_all_joined)
    monkeypatch.setattr(health, "_latest", health._Run(health.Limits(queues=())))
    health._latest.done.set()  # no earlier test's run to wait for or join
    settings.DELAYJOBS = {**settings.DELAYJOBS, "CACHE_ALIAS": "no-such-cache"}
    raised: list[BaseException] = []
    limits = health.Limits(queues=("default",), min_workers=0, timeout=8)

    def call() -> None:
        try:
            health.run_from_settings(limits)
        except BaseException as exc:
            raised.append(exc)

    threads = [threading.Thread(target=call) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)
    assert len(raised) == callers and runs == [1], (raised, runs)
    assert all(isinstance(exc, DelayJobsError) for exc in raised), raised
    assert len({id(exc) for exc in raised}) == callers  # each its own
    assert len({id(exc.__cause__) for exc in raised}) == 1  # the run's one exception
    cause = raised[0].__cause__
    assert cause is not None and type(cause) is type(raised[0])
    assert str(cause) == str(raised[0]) and "no-such-cache" in str(cause)
    # The run's exception keeps its own traceback: no caller's frames were added to it.
    frames = []
    tb = cause.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert "run_from_settings" not in frames and "call" not in frames, frames


def test_a_callers_copy_of_an_error_whose_init_its_args_do_not_fit_keeps_type_and_fields():
    """``PartlyUnavailable(message, done)`` keeps only the message in its args: copy.copy
    cannot rebuild it, and the copy is made without its __init__."""
    error = PartlyUnavailable("a master is down", done=["id"])
    own = health._own(error)
    assert own is not error and type(own) is PartlyUnavailable
    assert (str(own), own.done) == ("a master is down", ["id"])


def test_a_copy_of_an_error_whose_init_rewrites_its_args_keeps_its_message():
    """copy.copy calls ``__init__`` with the args it set: "code 7" would become "code
    code 7". The copy is made without its ``__init__`` then."""

    class Rewrites(Exception):
        def __init__(self, code: object) -> None:
            super().__init__(f"code {code}")

    error = Rewrites(7)
    own = health._own(error)
    assert own is not error and type(own) is Rewrites and str(own) == "code 7"


def test_a_copy_that_cannot_be_made_is_the_shared_exception_as_before():
    class Strict(Exception):
        def __new__(cls, code: object) -> Strict:
            if not isinstance(code, int):
                raise TypeError("an int")
            return super().__new__(cls, code)

        def __init__(self, code: int) -> None:
            super().__init__(f"code {code}")

    error = Strict(7)
    assert health._own(error) is error  # neither copy.copy nor __new__ can remake it
