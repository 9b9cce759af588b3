"""A callback in flight when its worker is killed with SIGKILL: delivered again, with the
same webhook-id, by another worker process; the job ends succeeded once."""

from __future__ import annotations

import json
import signal

import pytest

from django_delayjobs import schedule_http
from django_delayjobs.callbacks.signing import new_secret, verify
from django_delayjobs.connection import get_engine
from django_delayjobs.models import Job, Status
from tests.callback_server import Reply
from tests.helpers import start_worker, stop, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SECRET = new_secret()


def test_kill_9_while_a_callback_is_in_flight(redis_url, redis_client, tmp_path, settings,
                                              callback_server):  # fmt: skip
    http = {
        "HTTP_ALLOWED_HOSTS": [callback_server.netloc],
        "HTTP_ALLOW_PRIVATE_NETWORKS": True,
        "HTTP_SIGNING_SECRETS": [SECRET],
        "HTTP_READ_TIMEOUT_SECONDS": 120.0,
        "HTTP_TIMEOUT_SECONDS": 120.0,
    }
    settings.DELAYJOBS = {**settings.DELAYJOBS, **http}
    env = {"DELAYJOBS_LEASE_SECONDS": "2", "DELAYJOBS_TEST_HTTP": json.dumps(http)}
    callback_server.script("/hook", Reply(hang=True), Reply(200, b"thanks"))

    def live() -> bool:
        return get_engine().stats("default").live_workers >= 1

    first = start_worker(redis_url, env=env, log=tmp_path / "a.log")
    try:
        wait_for(live)
        job = schedule_http(callback_server.url(), json={"order": 42}, in_=0)
        callback_server.wait_for(1)  # in flight: the server holds it without answering
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert Job.objects.get(pk=job.pk).status == Status.RUNNING
        second = start_worker(redis_url, env=env, log=tmp_path / "b.log")
        try:
            wait_for(lambda: Job.objects.get(pk=job.pk).status == Status.SUCCEEDED, timeout=30)
        finally:
            assert stop(second) == 0
    finally:
        if first.poll() is None:
            first.kill()
    job.refresh_from_db()
    first_try, second_try = callback_server.requests  # at least once: here, exactly twice
    assert first_try.headers["webhook-id"] == second_try.headers["webhook-id"] == str(job.pk)
    assert first_try.body == second_try.body == b'{"order":42}'
    for request in (first_try, second_try):
        assert verify(request.headers, request.body, [SECRET]) == str(job.pk)
    assert (job.status, job.attempts, job.deliveries) == (Status.SUCCEEDED, 1, 2)
    assert job.result["status"] == 200 and job.result["body"] == "thanks"
    kinds = list(job.events.values_list("kind", flat=True))
    assert kinds.count("succeeded") == 1 and "failed" not in kinds and "dead" not in kinds
