"""``DelayJobsBackend`` in the two roles Django's task tests are written for.

Django's tests configure ``DummyBackend`` (enqueue records the task, nothing runs) and
``ImmediateBackend`` (enqueue runs the task at once). Here each is played by
``DelayJobsBackend`` itself, with only what a test needs and a real deployment does not:

- ``DummyRole``: ``clear()`` (Django's tests call it in ``setUp``) and ``results`` (the
  tasks enqueued so far, each read back with ``get_result``: so a test comparing the
  result ``enqueue`` returned with ``results`` checks that the database round trip loses
  nothing).
- ``ImmediateRole``: ``enqueue`` then a burst run of the real worker
  (``run_delayworker --burst``: promoter, claim, run, record, ack) then ``get_result``.

``backends_played_by_delayjobs`` maps Django's backend paths in ``TASKS`` to these roles
while a conformance test class runs, so the tests' own ``override_settings`` (class level
and inside test bodies) get a ``DelayJobsBackend``.

``DELAYJOBS_TASKS_REFERENCE=1`` maps them to Django's own backends instead (the
backport's on Django 5.2): a reference run of the same harness, which shows what fails
without delayjobs (on 5.2, the backport's differences from Django's tests).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
from collections.abc import Iterator
from typing import Any
from unittest import mock

from django.core.management import call_command
from django.db import connection, connections

from django_delayjobs.backends import PREFIX, DelayJobsBackend
from django_delayjobs.models import Job

from . import compat


class DummyRole(DelayJobsBackend):
    """Enqueue writes the job; nothing runs it."""

    def clear(self) -> None:
        """Forget every task (test-only: Django's tests reset their backend with it)."""
        Job.objects.filter(action__startswith=PREFIX).delete()

    @property
    def results(self) -> list[Any]:
        """Every task enqueued so far, oldest first, as ``get_result`` reads it."""
        if _in_event_loop():
            # Django forbids the ORM inside an event loop (an async test reading
            # ``results``): read from a thread, with its own connection.
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                return pool.submit(self._read_results_in_thread).result()
        return self._read_results()

    def _read_results(self) -> list[Any]:
        ids = Job.objects.filter(action__startswith=PREFIX).order_by("created_at", "id")
        return [self.get_result(str(pk)) for pk in ids.values_list("pk", flat=True)]

    def _read_results_in_thread(self) -> list[Any]:
        try:
            return self._read_results()
        finally:
            connections.close_all()  # this helper thread's connection


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class ImmediateRole(DummyRole):
    """Enqueue, run the worker in burst mode, return what ``get_result`` reads."""

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        result = super().enqueue(task, args, kwargs)
        if connection.in_atomic_block:
            # The job reaches Redis when the enqueuing transaction commits (the outbox),
            # and a worker could not see the uncommitted row anyway: nothing can run yet.
            return result
        call_command("run_delayworker", "--burst", "--queues", task.queue_name, "-v", "0")
        return self.get_result(result.id)


_ROLES: dict[str, type[DelayJobsBackend]] = {
    f"{package}.backends.dummy.DummyBackend": DummyRole
    for package in ("django.tasks", "django_tasks")
} | {
    f"{package}.backends.immediate.ImmediateBackend": ImmediateRole
    for package in ("django.tasks", "django_tasks")
}


@contextlib.contextmanager
def backends_played_by_delayjobs() -> Iterator[None]:
    """While inside, a ``TASKS`` entry naming Django's Dummy or Immediate backend gets the
    matching role instead; any other backend path is created as usual."""
    handler_class = type(_task_backends())
    original = handler_class.create_connection

    roles = _reference_roles() if reference_run() else _ROLES

    def create_connection(self: Any, alias: str) -> Any:
        params = self.settings[alias]
        role = roles.get(params["BACKEND"])
        if role is None:
            return original(self, alias)
        return role(alias, params)

    with mock.patch.object(handler_class, "create_connection", create_connection):
        yield


def reference_run() -> bool:
    """True when Django's tests run against Django's own backends (see the docstring)."""
    return os.environ.get("DELAYJOBS_TASKS_REFERENCE") == "1"


def _reference_roles() -> dict[str, type[Any]]:
    if compat.native():
        return {}  # Django's own paths import as they are
    from django_tasks.backends.dummy import DummyBackend
    from django_tasks.backends.immediate import ImmediateBackend

    return {
        "django.tasks.backends.dummy.DummyBackend": DummyBackend,
        "django.tasks.backends.immediate.ImmediateBackend": ImmediateBackend,
    }


def _task_backends() -> Any:
    if compat.native():
        from django.tasks import task_backends
    else:
        from django_tasks import task_backends
    return task_backends
