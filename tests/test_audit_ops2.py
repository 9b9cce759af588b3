"""Audit ops2: failing tests for the bugs found (moved to their modules once fixed)."""

from __future__ import annotations

import datetime
import subprocess
import sys

import pytest
from django.utils import timezone

from tests.helpers import ROOT, worker_env
from tests.testapp import task_functions as t

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _clean_redis(redis_client):
    pass


#: A web process (the admin, the REST API): Django set up, no task module imported and
#: no task backend touched; it cancels a task's job by id, as the admin's action does.
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
    """docs/tasks.md: task_finished is sent when the job is cancelled, from any process:
    the receivers were connected only once a backend was created, and a task was looked
    up only among those the process had imported."""
    when = timezone.now() + datetime.timedelta(hours=1)
    result = t.add.using(run_after=when).enqueue(1, 2)
    env = {**worker_env(redis_url), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    child = subprocess.run(
        [sys.executable, "-c", CANCEL_IN_WEB_PROCESS, result.id],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.strip() == str([(result.id, "FAILED")])
