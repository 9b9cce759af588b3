"""Audit of the documentation against the code: each test quotes a statement of the docs
that the code does not keep, and fails until one of the two changes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from django_delayjobs import schedule, signals
from django_delayjobs.models import Job, Status
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True)


def burst(*args: str) -> None:
    call_command("run_delayworker", "--burst", "-v", "0", *args)


def test_expired_job_is_skipped_instead_of_started():
    """docs/scheduling.md:91: ``expires`` -- "past it the job is `skipped` instead of
    started" (and docs/scheduling.md:79, "never start more than 1 h late").

    The code claims the row first (execution.py:131-135: ``claim()`` sets status
    ``running``, ``attempts + 1``, ``started_at``, writes a ``started`` event and sends
    ``job_started``) and only then looks at ``expires_at`` (execution.py:136) and settles
    the job ``skipped``: a job past its expiry is started (attempt 1, a ``started`` event,
    the ``job_started`` signal, and through it django.tasks' ``task_started``)."""
    now = timezone.now()
    # Due two hours ago, expired an hour ago: the door accepts it (expiry after the due time).
    job = schedule(tasks.record, at=now - timedelta(hours=2), args=["late"],
                   expires=timedelta(hours=1))  # fmt: skip
    started: list[str] = []

    def on_started(sender, job, **kwargs):
        started.append(str(job.pk))

    signals.job_started.connect(on_started, dispatch_uid="audit-docs-started")
    try:
        burst()
    finally:
        signals.job_started.disconnect(dispatch_uid="audit-docs-started")
    job.refresh_from_db()
    assert job.status == Status.SKIPPED
    assert not Record.objects.exists()
    kinds = list(job.events.values_list("kind", flat=True))
    assert (kinds, job.attempts, job.started_at, started) == (
        ["scheduled", "skipped"],
        0,
        None,
        [],
    ), f"an expired job was started: events {kinds}, attempts {job.attempts}, job_started {started}"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("HTTP_CONNECT_TIMEOUT_SECONDS", 0),
        ("HTTP_TIMEOUT_SECONDS", 10_000),
        ("HTTP_RESPONSE_KEEP_BYTES", -1),
        ("HTTP_ALLOW_PRIVATE_NETWORKS", "yes"),
    ],
)
def test_bad_http_setting_is_e009(settings, name, value):
    """docs/callbacks.md:298 (under the table of every ``HTTP_*`` and ``API_CALLBACK_*``
    setting): "All are checked by `manage.py check` (`django_delayjobs.E009` for a bad
    value, ...".

    Only the ``HTTP_*`` settings declared with ``_http()`` (conf.py:80-82, kind "http")
    get E009. The numeric ones (conf.py:139-146) are plain ``setting(..., low, high)``, so a
    bad value is E003 (float) or E004 (int) (checks.py:20-23, conf.py:194-199), and the
    bool ``HTTP_ALLOW_PRIVATE_NETWORKS`` (conf.py:135) is E006."""
    from django_delayjobs.checks import check_settings

    settings.DELAYJOBS = {**settings.DELAYJOBS, name: value}
    ids = sorted({e.id for e in check_settings() if name in e.msg})
    assert ids == ["django_delayjobs.E009"], f"DELAYJOBS[{name!r}] = {value!r} gives {ids}"


def test_a_json_argument_shaped_like_a_tag_is_accepted():
    """docs/tasks.md:53: task arguments are "JSON | normalised as the framework does
    (`normalize_json` ...); anything else raises `TypeError` ... arguments that do not
    fit the function raise `InvalidTask`" (and docs/scheduling.md:87: ``args``/``kwargs``
    are "JSON values plus `datetime`, `date`, `Decimal`, `UUID`").

    A JSON object whose only key is one of the door's tags (``$dt``, ``$d``, ``$dec``,
    ``$uuid``) is plain JSON that fits the function, yet serialization.py:167-169 refuses it
    ("uses the reserved key"), so ``schedule()`` raises ``TypeError`` and the backend
    turns it into ``InvalidTask`` (backends.py:146-147): ``{"$d": "2030-01-01"}`` cannot
    be enqueued, though Django's own backends take it."""
    from tests.testapp import task_functions as t

    result = t.introspect.enqueue({"$d": "2030-01-01"})
    assert Job.objects.filter(pk=result.id).exists()


def test_metrics_answer_a_logged_in_non_staff_user_403():
    """docs/metrics.md:44 (who may read ``metrics/``): "anyone else logged in | 403"; only
    a wrong or unexpected *Bearer* token is 401 (docs/metrics.md:42).

    views.py:35 answers 403 only when the request has no ``Authorization`` header at all:
    a logged-in user who is not allowed and whose browser sends any other credentials (a
    site behind HTTP Basic auth sends ``Authorization: Basic ...`` on every request) gets
    401 with ``WWW-Authenticate: Bearer`` (views.py:37-39), as an anonymous caller does."""
    from django.test import Client

    from tests.test_rest_helpers import make_user

    client = Client()
    client.force_login(make_user("bob", staff=False))
    assert client.get("/delayjobs/metrics/").status_code == 403  # no header: as documented
    answer = client.get("/delayjobs/metrics/", HTTP_AUTHORIZATION="Basic Ym9iOnB3")
    assert answer.status_code == 403, (answer.status_code, answer.headers.get("WWW-Authenticate"))
