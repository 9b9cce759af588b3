"""Audit of the django.tasks backend, round 5."""

from __future__ import annotations

import collections

import pytest
from django.core.management import call_command

from django_delayjobs.backends import InvalidTask, TaskResultStatus
from django_delayjobs.models import Job
from tests.testapp import task_functions as t

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
