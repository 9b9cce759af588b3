"""The admin, fourth audit: the jobs' database down, the queue page at scale, purge."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import ROOT, worker_env

#: The project's database (users, sessions) up; the jobs' ("jobs") a file SQLite cannot
#: open (its directory does not exist). Prints each page's status and whether it holds a
#: traceback or the word "jobs" as the alias named.
JOBS_DOWN = """
import json
import uuid

import django

django.setup()
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.test.utils import setup_test_environment

call_command("migrate", verbosity=0)
setup_test_environment()  # ALLOWED_HOSTS for the test client
client = Client(raise_request_exception=False)
client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw"))
pk = str(uuid.uuid4())
base = "/admin/django_delayjobs/job/"
pages = {
    "changelist": client.get(base),
    "change": client.get(f"{base}{pk}/change/"),
    "queues": client.get(f"{base}queues/"),
    "action": client.post(base, {"action": "cancel_jobs", "_selected_action": [pk]}),
    "requeue": client.post(f"{base}queues/requeue/", {"one": pk}),
}
print(json.dumps({name: [r.status_code, r.content.decode()] for name, r in pages.items()}))
"""


def test_the_job_pages_say_the_jobs_database_cannot_be_reached(redis_url, tmp_path):
    """With the jobs' database alias down (the project's up), every job page was a 500
    with a traceback; now a 503 that names the alias and says what is wrong."""
    env = {**worker_env(redis_url), "DJANGO_SETTINGS_MODULE": "tests.settings",
           "DELAYJOBS_TEST_SQLITE": str(tmp_path / "default.sqlite3"),
           "DELAYJOBS_TEST_JOBS_DB": str(tmp_path / "missing" / "jobs.sqlite3")}  # fmt: skip
    env.pop("DATABASE_URL", None)
    done = subprocess.run([sys.executable, "-c", JOBS_DOWN], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:]
    pages = json.loads(done.stdout.strip().splitlines()[-1])
    for name, (status, body) in pages.items():
        assert status == 503, (name, status, body[-3000:])
        assert "The jobs database “jobs” cannot be reached" in body, name
        assert "Traceback" not in body, name
