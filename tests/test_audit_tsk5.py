"""Audit of the django.tasks backend, round 5."""

from __future__ import annotations

import collections

import pytest
from django.core.management import call_command

from django_delayjobs.backends import InvalidTask, TaskResultStatus
from django_delayjobs.models import Job
from tests.testapp import task_functions as t

try:
    from django.tasks import default_task_backend
except ImportError:
    from django_tasks import default_task_backend

pytestmark = pytest.mark.django_db(transaction=True)


def contains_itself(kind: type) -> object:
    loop = kind()
    loop.append(loop)
    return loop


@pytest.mark.parametrize("kind", [collections.UserList, collections.deque])
def test_a_sequence_that_contains_itself_is_an_invalid_task(kind):
    """The framework's ``normalize_json`` walks any sequence, the depth check before it
    only lists and tuples: a ``UserList`` or ``deque`` that contains itself (or nests
    thousands deep) raised ``RecursionError`` from ``enqueue``, and failed a task that
    returned one with it."""
    with pytest.raises(InvalidTask, match="levels deep"):
        t.add.enqueue(contains_itself(kind), 1)
    assert not Job.objects.exists()
    result = t.returns_sequence_in_itself.enqueue(kind.__name__)
    call_command("run_delayworker", "--burst", "-v", "0")
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    (error,) = result.errors
    assert error.exception_class_path == "django_delayjobs.exceptions.InvalidSchedule"


def test_arguments_given_as_an_iterator_are_refused_as_the_framework_refuses_them():
    """``enqueue`` read its ``args`` twice (a copy for the depth check, then another): an
    iterator gave nothing the second time, and the task was enqueued without its
    arguments. The framework's ``normalize_json`` refuses an iterator."""
    with pytest.raises(TypeError, match="Unsupported type"):
        default_task_backend.enqueue(t.echo, iter([1, 2]), {})
    assert not Job.objects.exists()
