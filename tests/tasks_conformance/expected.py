"""Django's task tests that ``DelayJobsBackend`` is expected to fail, and why.

Keys are ``"<Django's test class>.<test method>"``. Each listed test runs as a strict
xfail: if it passes, the run fails, and the entry must go. docs/tasks.md carries the
same list for readers (a test checks that it names every entry).
"""

from __future__ import annotations

from . import compat

_IS_DJANGOS_CLASS = (
    "asserts that the configured backend is an instance of Django's {0}; here "
    "DelayJobsBackend plays that role (and passes the rest of the class)"
)
_NO_SYNC_DB_IN_ASYNC = (
    "calls the synchronous result.refresh() inside an async test; a result here is read "
    "from the database, and Django refuses database queries inside an event loop "
    "(SynchronousOnlyOperation): async code calls arefresh()"
)
_MUTATES_MEMORY = (
    "changes the {0} stored in DummyBackend's in-memory results list and expects "
    "{1} to return the change; here results live in the database"
)
_DECLINED_FLAG = (
    "asserts that {0}, as ImmediateBackend does ({1} = False); DelayJobsBackend "
    "supports it ({1} = True)"
)

#: Expected to fail on every Django line: what follows from DelayJobsBackend being a
#: database- and worker-backed backend, not Django's in-memory/in-process ones.
ALWAYS: dict[str, str] = {
    "DummyBackendTestCase.test_using_correct_backend": _IS_DJANGOS_CLASS.format("DummyBackend"),
    "ImmediateBackendTestCase.test_using_correct_backend": _IS_DJANGOS_CLASS.format(
        "ImmediateBackend"
    ),
    "TaskTestCase.test_using_correct_backend": _IS_DJANGOS_CLASS.format("DummyBackend"),
    "TaskTestCase.test_get_backend": _IS_DJANGOS_CLASS.format(
        "DummyBackend and ImmediateBackend (through Task.get_backend())"
    ),
    "DummyBackendTestCase.test_refresh_result": _MUTATES_MEMORY.format(
        "result", "result.refresh()"
    ),
    "DummyBackendTestCase.test_refresh_result_async": _MUTATES_MEMORY.format(
        "result", "result.arefresh()"
    ),
    "TaskTestCase.test_refresh_result": _NO_SYNC_DB_IN_ASYNC,
    "ImmediateBackendTestCase.test_cannot_get_result": _DECLINED_FLAG.format(
        "get_result() raises NotImplementedError", "supports_get_result"
    ),
    "ImmediateBackendTestCase.test_cannot_refresh_result": _DECLINED_FLAG.format(
        "refresh() and arefresh() raise NotImplementedError", "supports_get_result"
    ),
    "ImmediateBackendTestCase.test_cannot_pass_run_after": _DECLINED_FLAG.format(
        "a task with run_after is refused", "supports_defer"
    ),
    "ImmediateBackendTestCase.test_throws_keyboard_interrupt": (
        "expects enqueue() to raise the KeyboardInterrupt the task raised: ImmediateBackend "
        "runs the task in the caller's thread and lets a Ctrl-C through; here a worker runs "
        "it, and a task that raises KeyboardInterrupt has failed (the enqueuer was not "
        "interrupted)"
    ),
    "ImmediateBackendTransactionTestCase.test_doesnt_wait_until_transaction_commit_by_default": (
        "expects the task to have run before the enqueuing transaction commits; here the job "
        "reaches Redis when it commits (the outbox: a rolled-back transaction enqueues "
        "nothing), so a worker runs it after the commit"
    ),
}

#: Expected to fail until a change made elsewhere lands (remove the entry then: a strict
#: xfail that passes fails the run).
PENDING: dict[str, str] = {}

#: Expected to fail only with the django-tasks backport (Django 5.2): each fails against
#: the backport's own DummyBackend/ImmediateBackend too (DELAYJOBS_TASKS_REFERENCE=1).
BACKPORT: dict[str, str] = {
    "DummyBackendTestCase.test_validate_disallowed_async_task": (
        "the backport says 'Backend does not support async tasks.' where Django says 'async Tasks.'"
    ),
}


def expected_failures() -> dict[str, str]:
    """The expected failures for the Django line under test."""
    expected = {**ALWAYS, **PENDING}
    return expected if compat.native() else {**expected, **BACKPORT}
