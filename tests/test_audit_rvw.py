"""Mends from a fresh-eyes review (audit-rvw). Real servers: SQLite or PostgreSQL, a
private Redis. Interleavings are forced by hooks around the real functions."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from django_delayjobs import Retry, schedule, schedule_http
from django_delayjobs.connection import get_engine
from django_delayjobs.execution import Execution
from django_delayjobs.models import Job, Status
from django_delayjobs.outcomes import Outcome, Result, settle
from tests.callback_server import Reply
from tests.test_audit_rce2 import claimed_in_redis, pending_ids
from tests.test_audit_sec import TOKEN, allow, burst, shown
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def echoed(
    settings, callback_server, headers: dict[str, str], answer: str
) -> tuple[Job, list[str]]:
    """A callback to a destination with ``headers``, whose receiver answers 500 with
    ``answer``; return the job (retrying) and the texts it kept (its error, its events)."""
    allow(settings, callback_server, HTTP_DESTINATIONS={"hooks": {
        "url": callback_server.url("/base"), "headers": headers,
    }})  # fmt: skip
    callback_server.script("/base/page", Reply(500, answer.encode()))
    job = schedule_http("hooks:/page", in_=0)
    burst()
    [request] = callback_server.wait_for(1)
    for name, value in headers.items():  # sent as configured: only the kept texts masked
        assert request.headers[name.lower()] == value
    job.refresh_from_db()
    assert job.status == Status.RETRYING
    return job, [job.last_error, *job.events.values_list("message", flat=True)]


def test_a_retry_handed_back_while_another_worker_runs_the_job_keeps_its_next_retry():
    """Worker A's attempt failed, to be retried at once; A hands the id back, and worker B
    claims it before A reads the row again (``follow_row``): running, so not waiting. B's
    attempt then failed too, and B handed the id back for its own retry, before A acted on
    what it had read: A removed the id from pending, so the retrying job was in no Redis
    structure, and ran only when a reconcile sweep found it."""
    job = schedule(tasks.retry_later, in_=0, args=[0, "second"])
    (job_id,) = claimed_in_redis(job)
    first = Execution("default", job_id, "A").run()  # Retry(after=0): due again now
    assert first.outcome == Outcome.RETRYING
    engine = get_engine()
    b = Execution("default", job_id, "B")
    b_failed: list[Result] = []

    def b_fails() -> None:  # B's attempt fails, its retry an hour away; B settles it
        if not b_failed:
            b_failed.append(b.failed(Retry("again", after=3600), [], 0.0))
            settle(engine, "default", job_id, b_failed[0])

    class Hooked:
        """The real engine, with B's steps at two moments of A's settle."""

        def __getattr__(self, name: str) -> Any:
            return getattr(engine, name)

        def nack(self, queue: str, items: dict[str, float]) -> int:
            handed_back = engine.nack(queue, items)
            assert claimed_in_redis(job) == [job_id]  # B takes the id from Redis...
            claimed = b.claim()
            assert isinstance(claimed, Job)
            b.job = claimed  # ... and its row: running
            return handed_back

        def remove(self, queue: str, ids: list[str]) -> int:
            b_fails()  # after A's read of the row
            return engine.remove(queue, ids)

    settle(Hooked(), "default", job_id, first)  # type: ignore[arg-type]
    b_fails()  # (if A's settle had no later moment for it: still after A's read)
    assert b_failed[0].outcome == Outcome.RETRYING
    assert Job.objects.get(pk=job.pk).status == Status.RETRYING
    assert pending_ids() == {job_id}


def test_a_cookie_a_receiver_shows_alone_is_masked_in_the_jobs_history(
    callback_server, settings, redis_client
):
    """A destination's ``Cookie`` header holds several cookies, each a credential. An error
    page lists the request's cookies one by one (``session: <value>``): the masking knew
    the header's whole value and its part after the last space (``theme=light``), so the
    session cookie's value reached the job's history and error."""
    cookie = f"session={TOKEN}; theme=light"
    job, kept = echoed(settings, callback_server, {"Cookie": cookie}, f"Cookies: session: {TOKEN}")
    for text in kept + shown(job):
        assert TOKEN not in text
    assert "session: ***" in job.last_error


def test_a_credential_a_receiver_quotes_in_json_with_escaped_slashes_is_masked(
    callback_server, settings, redis_client
):
    """A debug endpoint answers the request's headers as JSON, and PHP's ``json_encode``
    (like others) writes each ``/`` as ``\\/``: a base64 token holding one reached the
    job's history and error, since only its plain form was masked."""
    token = "dXNl/cjpw+YXNz/d29yZA=="
    escaped = token.replace("/", "\\/")
    answer = '{"headers": {"Authorization": "Basic ' + escaped + '"}}'
    job, kept = echoed(settings, callback_server, {"Authorization": f"Basic {token}"}, answer)
    for text in kept:
        assert token not in text and escaped not in text
    assert '"Authorization": "***"' in job.last_error


def test_a_basic_password_a_receiver_shows_decoded_is_masked(
    callback_server, settings, redis_client
):
    """A destination's ``Authorization: Basic <base64 of user:password>``: a receiver's
    page that shows the credentials decoded (PHP's ``PHP_AUTH_PW``, a debug page) put the
    password in the job's history and error, since only the base64 text was masked."""
    password = "pa55-w0rd-of-the-app"
    basic = base64.b64encode(f"shop:{password}".encode()).decode()
    page = f"PHP_AUTH_USER: shop\nPHP_AUTH_PW: {password}"
    job, kept = echoed(settings, callback_server, {"Authorization": f"Basic {basic}"}, page)
    for text in kept + shown(job):
        assert password not in text
    assert "PHP_AUTH_PW: ***" in job.last_error
