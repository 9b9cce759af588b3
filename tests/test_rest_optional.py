"""Without drf-spectacular (the ``api-schema`` extra) the API works and schema/ is absent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Run in a fresh interpreter where importing drf_spectacular fails, as if not installed.
PROGRAM = """
import sys
sys.modules["drf_spectacular"] = None
import django
django.setup()
from django.urls import reverse, NoReverseMatch
from django_delayjobs.rest import urls, views
names = sorted(p.name for p in urls.urlpatterns)
assert "schema" not in names, names
assert "queues" in names and "job-list" in names, names
inspector = views.JobViewSet.schema
assert type(inspector).__module__.startswith("rest_framework."), inspector
reverse("delayjobs_api:job-list")
try:
    reverse("delayjobs_api:schema")
except NoReverseMatch:
    print("ok")
"""


def test_without_drf_spectacular_there_is_no_schema_endpoint():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONWARNINGS": "error"}
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
