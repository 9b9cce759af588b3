"""Audit of the django.tasks backend: failing reproductions of bugs (one test per bug)."""

from __future__ import annotations

import datetime
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.utils import timezone

from django_delayjobs import GiveUp
from django_delayjobs.backends import DelayJobsBackend, InvalidTask, TaskResultStatus
from django_delayjobs.models import Job
from tests.helpers import ROOT, worker_env
from tests.testapp import task_functions as t

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _clean_redis(redis_client):
    pass


def burst() -> None:
    call_command("run_delayworker", "--burst", "--queues", "default,other", "-v", "0")


#: What a task might put in its message: the body of a remote service's error page, a
#: subprocess's stderr, a traceback logged by another program.
REMOTE_TRACEBACK = (
    "the pricing service answered 500:\n"
    "Traceback (most recent call last):\n"
    '  File "/srv/pricing/views.py", line 12, in quote\n'
    "KeyError: 'sku'"
)


@task
def fail_quoting_a_traceback() -> None:
    raise ValueError(REMOTE_TRACEBACK)


@task
def give_up() -> None:
    raise GiveUp("the order is gone")


def test_a_traceback_quoted_in_the_message_does_not_change_the_error_class():
    """A task raised ValueError whose message quotes another program's traceback (a line
    "Traceback (most recent call last):" and a "KeyError: ..." line). exception_path()
    (task_history.py:90-93) takes the LAST header line anywhere in the text, including
    inside the message, so the result's error reads ``builtins.KeyError`` and
    ``exception_class`` is KeyError: the message forges the exception class. Right: the
    class of the exception the task raised, ValueError (the worker knows it; it could
    record the class path, or the parser could take the last header of the frames only)."""
    result = fail_quoting_a_traceback.enqueue()
    burst()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    (error,) = result.errors
    assert "KeyError: 'sku'" in error.traceback
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError


def test_a_task_that_gives_up_reads_with_the_class_it_raised():
    """A task that raises django_delayjobs' GiveUp (likewise a final Retry, and the
    TimeLimitExceeded the worker records) is recorded by execution.describe()
    (execution.py:89-94) as "GiveUp: <message>", without the module, and exception_path()
    reads that as ``builtins.GiveUp``, which does not exist, so the error says
    ``builtins.Exception``. docs/tasks.md: the path names the class when the reading process
    has loaded it ("a worker always has: it raised it"); this process has. Right:
    ``django_delayjobs.exceptions.GiveUp``."""
    result = give_up.enqueue()
    burst()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    (error,) = result.errors
    assert "the order is gone" in error.traceback
    assert error.exception_class_path == "django_delayjobs.exceptions.GiveUp"
    assert error.exception_class is GiveUp


def test_deeply_nested_arguments_are_refused_with_a_documented_error():
    """enqueue() runs the framework's recursive normalize_json over the arguments
    (backends.py:129) before schedule()'s door, which refuses nesting deeper than 32
    levels with InvalidSchedule. A list nested 5,000 deep (or one that contains itself)
    therefore escapes enqueue() as a RecursionError instead of the documented TypeError /
    InvalidTask ("anything else raises TypeError before anything is written",
    docs/tasks.md). Right: InvalidTask (or TypeError), nothing written."""
    deep: list[object] = []
    inner = deep
    for _ in range(5000):
        inner.append([])
        inner = inner[0]  # type: ignore[assignment]
    with pytest.raises((InvalidTask, TypeError)):
        t.add.enqueue(deep, 1)
    assert not Job.objects.exists()


def test_a_task_that_validate_task_accepts_can_be_enqueued():
    """The framework's validate_task accepts a whole-number float priority (it checks
    ``int(priority) != priority``), and so does DelayJobsBackend.validate_task, which the
    Task runs when ``using(priority=50.0)`` creates it. enqueue() then hands the float to
    schedule(), whose door.check_priority refuses anything but an int, and the backend
    raises InvalidTask "priority must be an int, not float" (backends.py:136-147): a task
    the backend declared valid cannot be enqueued. Right: enqueue it with priority 50 (or
    refuse it in validate_task already)."""
    future = timezone.now() + datetime.timedelta(hours=1)
    result = t.add.using(priority=50.0, run_after=future).enqueue(1, 2)
    assert Job.objects.get(pk=result.id).priority == 50


@pytest.mark.parametrize("options", [None, ["MAX_ATTEMPTS"]])
def test_options_that_are_not_a_dict_are_improperly_configured(options):
    """``TASKS[...]["OPTIONS"]`` of None (``"OPTIONS": env_options or None``) or a list makes
    _options() (backends.py:166,172) raise a bare TypeError ("'NoneType' object is not
    iterable", "'list' object is not a mapping") when the backend is created, i.e. at the
    first ``@task`` import. docs/tasks.md promises ImproperlyConfigured for bad OPTIONS
    (and Django's own backends accept OPTIONS None). Right: ImproperlyConfigured naming
    TASKS[alias]['OPTIONS'] (or None read as {})."""
    try:
        backend = DelayJobsBackend("odd", {"OPTIONS": options})
    except ImproperlyConfigured:
        return
    assert backend.max_attempts == 1


#: A web process: Django set up and its URLconf loaded, no worker, no task module imported
#: by hand; it reads a result by id only, as a status endpoint does.
READ_RESULT = """
import sys
import django
django.setup()
from django.urls import get_resolver
get_resolver().url_patterns
try:
    from django.tasks import default_task_backend
except ImportError:
    from django_tasks import default_task_backend
print(default_task_backend.get_result(sys.argv[1]).status)
"""


def test_a_result_can_be_read_from_a_process_that_did_not_import_the_task(redis_url):
    """docs/tasks.md: ``supports_get_result`` "from any process: the result is read from the
    job's row and events" (the framework's meaning too: results from any thread/process;
    Django's docs show ``default_task_backend.get_result(result_id)``). But to_result()
    (backends.py:188-192) raises TaskResultDoesNotExist "... is not imported in this
    process" unless the task's module happens to be imported, and nothing imports it in a
    web process (only run_delayworker autodiscovers ``tasks`` modules). So a status view
    answers "does not exist" for a task that succeeded. Right: the result (e.g. autodiscover
    installed apps' ``tasks`` modules like the worker does, in ready() or on a miss)."""
    result = t.add.enqueue(2, 3)
    burst()
    assert t.add.get_result(result.id).status == TaskResultStatus.SUCCESSFUL
    env = {**worker_env(redis_url), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    child = subprocess.run(
        [sys.executable, "-c", READ_RESULT, result.id],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.strip() == "SUCCESSFUL"
