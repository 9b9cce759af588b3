"""django.tasks results read from the database: retries, errors, async tasks, return values."""

from __future__ import annotations

import datetime
import sys
import traceback

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from django_delayjobs import GiveUp
from django_delayjobs.backends import DelayJobsBackend, TaskResultStatus
from django_delayjobs.exceptions import InvalidSchedule
from django_delayjobs.models import Job, Status
from django_delayjobs.task_history import exception_path
from tests.helpers import run_in_web_process
from tests.testapp import task_functions as t
from tests.testapp.models import Record

try:
    from django.tasks import default_task_backend
    from django.tasks import signals as task_signals
except ImportError:
    from django_tasks import default_task_backend
    from django_tasks import signals as task_signals

pytestmark = pytest.mark.django_db(transaction=True)

BACKEND = "django_delayjobs.backends.DelayJobsBackend"
TWO_ATTEMPTS = {
    "default": {"BACKEND": BACKEND, "QUEUES": ["default", "other"]},
    "twice": {"BACKEND": BACKEND, "OPTIONS": {"MAX_ATTEMPTS": 2}},
}


def burst() -> None:
    call_command("run_delayworker", "--burst", "--queues", "default,other", "-v", "0")


def labels() -> list[str]:
    return sorted(Record.objects.values_list("label", flat=True))


@override_settings(TASKS=TWO_ATTEMPTS)
def test_a_retried_task_keeps_each_attempt_and_its_error():
    result = t.flaky.using(backend="twice").enqueue("f")
    burst()
    job = Job.objects.get(pk=result.id)
    assert job.status == Status.RETRYING
    result.refresh()
    assert result.status == TaskResultStatus.READY  # "ready to be executed again"
    (error,) = result.errors
    assert error.exception_class is ValueError
    assert error.traceback.endswith("ValueError: attempt 1 fails\nsecond line of the message\n")
    assert job.reschedule(in_=0)  # skip the backoff
    burst()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 2  # the attempt number the task saw in its context
    assert result.attempts == 2 and len(result.errors) == 1
    assert result.started_at < result.last_attempted_at <= result.finished_at
    assert result.backend == "twice" and result.task.backend == "twice"
    assert labels() == ["f:2"]  # the failed attempt's write was rolled back
    assert default_task_backend.get_result(result.id) == result


def test_a_traceback_quoted_in_the_message_does_not_change_the_error_class(caplog):
    """The class is the first line the worker writes, not the last 'Traceback' header
    anywhere in the text (here, inside the message: KeyError)."""
    result = t.fail_quoting_a_traceback.enqueue()
    burst()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    (error,) = result.errors
    assert "KeyError: 'sku'" in error.traceback
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    # and the worker logs that line, not the message's last one
    assert "dead (builtins.ValueError: the pricing service answered 500:)" in caplog.text
    assert "(KeyError: 'sku')" not in caplog.text


def test_a_task_that_gives_up_reads_with_the_class_it_raised():
    """GiveUp (like a final Retry and TimeLimitExceeded) is written with its message only,
    but with its full class path, so it reads back as GiveUp, not builtins.Exception."""
    result = t.give_up.enqueue("the order is gone")
    burst()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    (error,) = result.errors
    assert error.traceback == "django_delayjobs.exceptions.GiveUp: the order is gone"
    assert error.exception_class_path == "django_delayjobs.exceptions.GiveUp"
    assert error.exception_class is GiveUp


#: A web process: Django set up and its URLconf loaded, no worker, no task module imported
#: by hand; it reads a result by id only, as a status endpoint does.
READ_RESULT = """
import sys
import django
django.setup()
from django.urls import get_resolver
get_resolver().url_patterns
assert "tests.testapp.task_functions" not in sys.modules
try:
    from django.tasks import default_task_backend
except ImportError:
    from django_tasks import default_task_backend
print(default_task_backend.get_result(sys.argv[1]).status)
"""


def test_a_result_can_be_read_from_a_process_that_did_not_import_the_task(redis_url):
    """supports_get_result: from any process. The backend imports the installed apps'
    tasks modules once, as the worker does, when it meets a task it has not imported."""
    result = t.add.enqueue(2, 3)
    burst()
    child = run_in_web_process(READ_RESULT, result.id, redis_url=redis_url)
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.strip() == "SUCCESSFUL"


#: A web process (the admin, the REST API): Django set up, no task module imported and
#: no task backend made; it cancels a task's job by id, as the admin's action does.
CANCEL_IN_WEB_PROCESS = """
import sys
import django
django.setup()
assert "tests.testapp.task_functions" not in sys.modules
try:
    from django.tasks.signals import task_finished
except ImportError:
    from django_tasks.signals import task_finished
from django_delayjobs.models import Job

finished = []
task_finished.connect(lambda sender, task_result, **kw: finished.append(task_result),
                      weak=False)
assert Job.objects.get(pk=sys.argv[1]).cancel()
print([(r.id, str(r.status)) for r in finished])
"""


def test_a_task_cancelled_in_a_process_that_did_not_import_it_sends_task_finished(redis_url):
    """task_finished is sent when the job is cancelled, from any process: its receivers
    were connected only once a backend was made, and the task looked up only among
    those the process had imported."""
    result = t.add.using(run_after=timezone.now() + datetime.timedelta(hours=1)).enqueue(1, 2)
    child = run_in_web_process(CANCEL_IN_WEB_PROCESS, result.id, redis_url=redis_url)
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.strip() == str([(result.id, "FAILED")])


def test_async_tasks_run_to_completion_in_the_worker():
    result = t.async_add.enqueue(2, 5)
    burst()
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 7)
    assert labels() == ["async:2+5"]


@pytest.mark.parametrize(
    ("task", "error", "message"),
    [
        # Its ORM calls ran in the worker thread, inside the attempt's transaction.
        (t.async_explode, RuntimeError, "async failure: gone"),
        # A return value that is not JSON fails the task, as in the framework.
        (t.returns_object, TypeError, "Unsupported type"),
        # JSON that the database cannot keep as it is (too big, say): InvalidSchedule.
        (t.returns_too_much, InvalidSchedule, "MAX_JSON_BYTES"),
        # JSON has one key for 1 and "1": refused, not one of the values silently lost.
        (t.returns_colliding_keys, ValueError, "the keys 1 and '1'"),
        # Refused before the framework's recursive normalize_json, not a RecursionError.
        (t.returns_itself, InvalidSchedule, "levels deep"),
    ],
)
def test_a_failed_task_rolls_back_its_writes(task, error, message):
    result = task.enqueue("gone")
    burst()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    (failure,) = result.errors
    assert failure.exception_class is error
    assert message in failure.traceback
    assert labels() == []


def test_return_values_are_normalised_as_the_framework_does():
    result = t.returns_tuple.enqueue()
    burst()
    assert t.returns_tuple.get_result(result.id).return_value == [1, "two"]


def test_a_return_value_with_keys_that_are_not_str_is_kept_as_json_keeps_it():
    """The framework's normalize_json keeps the keys 1 and True; its database-backed
    backends store them as JSON does ("1", "true"). The task succeeds, as there."""
    result = t.returns_int_keys.enqueue("keys")
    burst()
    read = t.returns_int_keys.get_result(result.id)
    assert read.status == TaskResultStatus.SUCCESSFUL
    assert read.return_value == {"1": "keys", "2": "two"}
    assert labels() == ["keys"]


def test_arguments_are_checked_before_anything_is_written():
    with pytest.raises(TypeError, match="Unsupported type"):
        t.add.enqueue(1, datetime.datetime.now(tz=datetime.UTC))
    with pytest.raises(TypeError, match="Unsupported type"):
        t.add.enqueue(1, b=object())
    assert not Job.objects.exists()
    result = t.add.enqueue(1, b=(2,))  # a tuple is a list in JSON, as in the framework
    assert result.kwargs == {"b": [2]}


def test_the_result_read_back_equals_the_one_enqueue_returned():
    when = timezone.now() + datetime.timedelta(hours=1)
    for task in (t.add, t.add.using(run_after=when), t.explode.using(queue_name="default")):
        result = task.enqueue(1, 2) if task.func is t.add.func else task.enqueue("x")
        read = default_task_backend.get_result(result.id)
        assert read == result
        assert read.task == task
    assert default_task_backend.get_result(result.id).task.run_after is None


def test_a_cancelled_task_is_finished_as_failed():
    finished = []

    def receiver(sender, task_result, **kwargs):
        finished.append((task_result.id, task_result.status))

    result = t.add.using(run_after=timezone.now() + datetime.timedelta(hours=1)).enqueue(1, 2)
    task_signals.task_finished.connect(receiver)
    try:
        assert Job.objects.get(pk=result.id).cancel()
    finally:
        task_signals.task_finished.disconnect(receiver)
    assert finished == [(result.id, TaskResultStatus.FAILED)]
    (error,) = default_task_backend.get_result(result.id).errors
    assert error.exception_class_path == "django_delayjobs.exceptions.DelayJobsError"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"MAX_ATTEMPTS": 0}, "MAX_ATTEMPTS"),
        ({"MAX_ATTEMPTS": "3"}, "MAX_ATTEMPTS"),
        ({"MAX_ATTEMPTS": True}, "MAX_ATTEMPTS"),
        ({"RETRIES": 3}, "unknown RETRIES"),
    ],
)
def test_bad_options_are_refused(options, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        DelayJobsBackend("bad", {"OPTIONS": options})


def test_options_none_reads_as_no_options_and_a_non_dict_is_refused():
    assert DelayJobsBackend("none", {"OPTIONS": None}).max_attempts == 1
    with pytest.raises(ImproperlyConfigured, match=r"\['OPTIONS'\] must be a dict, not list"):
        DelayJobsBackend("bad", {"OPTIONS": ["MAX_ATTEMPTS"]})


def test_an_alias_the_actor_column_cannot_hold_is_refused_at_start_up():
    """Every enqueue writes the actor "django.tasks:<alias>" (at most 150 characters):
    a longer alias, or one with a NUL, was refused by each enqueue instead."""
    assert DelayJobsBackend("a" * 137, {}).alias == "a" * 137
    for alias in ("a" * 138, "a\x00b"):
        with pytest.raises(ImproperlyConfigured, match="cannot name the actor"):
            DelayJobsBackend(alias, {})


@pytest.mark.parametrize(
    ("queues", "message"),
    [
        (None, "must be a list of queue names, not NoneType"),
        ("default", "must be a list of queue names, not str"),  # not the set of its letters
        ([["default"]], "a queue name must be a str, not \\['default'\\]"),
        ([1], "a queue name must be a str, not 1"),
    ],
)
def test_queues_of_the_wrong_shape_are_refused(queues, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        DelayJobsBackend("bad", {"QUEUES": queues})
    assert DelayJobsBackend("ok", {"QUEUES": ("default", "other")}).queues == {"default", "other"}


def test_bad_queue_names_are_refused():
    with pytest.raises(ImproperlyConfigured, match="QUEUES"):
        DelayJobsBackend("bad", {"QUEUES": ["no spaces"]})
    with (
        override_settings(TASKS={"default": {"BACKEND": BACKEND, "QUEUES": ["a b"]}}),
        pytest.raises(ImproperlyConfigured, match="'a b' is not valid"),
    ):
        default_task_backend.enqueue  # noqa: B018  (creates the configured backend)


class Outer:
    class InnerError(Exception):
        pass


def formatted(exc: BaseException) -> str:
    try:
        raise exc
    except BaseException as raised:
        return "".join(traceback.format_exception(raised))


def chained() -> str:
    try:
        try:
            raise KeyError("first")
        except KeyError as exc:
            raise ValueError("second") from exc
    except ValueError as exc:
        return "".join(traceback.format_exception(exc))


def with_note() -> str:
    exc = OSError("disk")
    exc.add_note("TypeError: a note that looks like an exception line")
    return formatted(exc)


@pytest.mark.parametrize(
    ("text", "path"),
    [
        (formatted(ValueError("a\nKeyError: b")), "builtins.ValueError"),
        (with_note(), "builtins.OSError"),
        (chained(), "builtins.ValueError"),
        (formatted(ExceptionGroup("g", [TypeError("t")])), "builtins.ExceptionGroup"),
        (formatted(Outer.InnerError("x")), f"{__name__}.Outer.InnerError"),
        (formatted(SystemExit("bye")), "builtins.SystemExit"),
        # Only classes this process already has: a traceback is data from the database.
        ("Traceback (most recent call last):\nnot_imported_pkg.Boom: x\n", "builtins.Exception"),
        ("Traceback (most recent call last):\nos.system: x\n", "builtins.Exception"),
        ("Traceback (most recent call last):\nbuiltins.print: x\n", "builtins.Exception"),
        # The worker's first line decides, whatever the notes and the traceback quote.
        (
            "builtins.OSError: a\nKeyError: b\nTraceback (most recent call last):\nKeyError: b\n",
            "builtins.OSError",
        ),
        ("django_delayjobs.exceptions.GiveUp: gone", "django_delayjobs.exceptions.GiveUp"),
        (
            "not_imported_pkg.Boom: x\nTraceback (most recent call last):\nKeyError: x\n",
            "builtins.Exception",
        ),
        ("attempt 3 of 3 never finished (worker lost)", "builtins.Exception"),
        ("", "builtins.Exception"),
    ],
)
def test_exception_path_reads_the_class_off_a_traceback(text, path):
    assert exception_path(text) == path
    assert "not_imported_pkg" not in sys.modules


def test_a_stored_traceback_cannot_make_the_process_import_a_module(tmp_path, monkeypatch):
    """The class path of a stored traceback is looked up in loaded modules' and classes'
    own ``__dict__``: never through ``getattr``, which would run a module ``__getattr__``
    (the lazy-loader pattern imports a submodule of the name asked for)."""
    package = tmp_path / "auditlazy"
    package.mkdir()
    (package / "__init__.py").write_text(
        "import importlib\n\n"
        "def __getattr__(name):  # the lazy-loader pattern\n"
        "    return importlib.import_module(f'{__name__}.{name}')\n"
    )
    (package / "payload.py").write_text("class Error(Exception):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import auditlazy  # noqa: F401  (loaded, as a library the project uses would be)

    try:
        text = "Traceback (most recent call last):\nauditlazy.payload.Error: from the row\n"
        assert exception_path(text) == "builtins.Exception"
        assert exception_path(f"auditlazy.payload.Error: x\n{text}") == "builtins.Exception"
        assert "auditlazy.payload" not in sys.modules
    finally:
        for name in [n for n in sys.modules if n == "auditlazy" or n.startswith("auditlazy.")]:
            del sys.modules[name]
