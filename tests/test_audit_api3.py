"""Audit of the REST API, third round: a cancel while Redis does not answer, who may reach
callbacks/ when the settings open it, page sizes, and the seconds of ``in``/``expires``."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from django_delayjobs import schedule, services
from django_delayjobs.connection import SOCKET_TIMEOUT, get_engine, reset_engine
from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.models import Job, Status
from tests.testapp import tasks

from .test_rest_helpers import burst, client_for, make_user, redis_state, url

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _clean_redis(redis_client):
    """Every test starts from an empty Redis database."""


# -- cancel while Redis does not answer ------------------------------------------------------


@pytest.fixture
def own_redis(tmp_path, settings) -> Iterator[EmbeddedRedis]:
    """A redis-server of this test's own (the jobs' Redis), which it may stop with SIGSTOP."""
    server = EmbeddedRedis(tmp_path / "redis")
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": server.start()}
    assert server.pid is not None
    try:
        yield server
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.close()


@pytest.mark.slow
@pytest.mark.parametrize("through", ["python", "api"])
def test_a_cancel_while_redis_does_not_answer_waits_for_one_timeout(own_redis, through):
    """Redis frozen: the cancel's removal timed out on the job's shard, then read the
    queue directory (for shards of an older count) and timed out again: two timeouts on
    every cancel. The cancel is committed all the same, and the id Redis still holds is
    acked by the worker that claims it once Redis answers again."""
    api = client_for(make_user(superuser=True))
    job = schedule(tasks.record, in_=0, args=["x"])
    assert redis_state(job) in ("pending", "ready")
    assert own_redis.pid is not None
    reset_engine()  # as in another web process: one that has not just read the directory
    get_engine().client.ping()  # the connection is open: what follows is the read's wait
    os.kill(own_redis.pid, signal.SIGSTOP)
    started = time.monotonic()
    if through == "api":
        assert api.post(url("jobs", job.pk, "cancel")).status_code == 200
    else:
        assert services.cancel(job)
    took = time.monotonic() - started
    os.kill(own_redis.pid, signal.SIGCONT)
    assert took < 1.5 * SOCKET_TIMEOUT, took
    assert Job.objects.get(pk=job.pk).status == Status.CANCELLED
    assert redis_state(job) is not None  # the removal did not happen...
    burst()
    assert redis_state(job) is None  # ...the worker cleaned it up
    assert Job.objects.get(pk=job.pk).status == Status.CANCELLED


# -- callbacks/ open to anyone ---------------------------------------------------------------

ALLOW_ANY = "rest_framework.permissions.AllowAny"
ADD_JOB = ["django_delayjobs.add_job"]


@pytest.mark.parametrize(
    ("classes", "needed", "warned"),
    [
        ([ALLOW_ANY], [], True),
        ([], [], True),  # no class: every request passes
        (["rest_framework.permissions.IsAuthenticatedOrReadOnly"], [], False),  # a POST not
        (["rest_framework.permissions.IsAdminUser"], [], False),  # staff only
        ([ALLOW_ANY], ADD_JOB, False),  # an anonymous user holds no permission
    ],
)
def test_callbacks_open_to_anonymous_users_are_warned_of(settings, classes, needed, warned):
    """``API_CALLBACK_PERMISSIONS = []`` with ``API_PERMISSION_CLASSES`` that let anyone in
    (``AllowAny``, or none) let anonymous users make this site's servers send HTTP requests,
    and cancel other callers' callbacks by key, and nothing said so. A warning names the
    settings, and the endpoint lets an anonymous user in exactly when it is given."""
    from django_delayjobs.checks import check_settings

    settings.DELAYJOBS = {**settings.DELAYJOBS, "API_PERMISSION_CLASSES": classes,
                          "API_CALLBACK_PERMISSIONS": needed}  # fmt: skip
    found = [m for m in check_settings() if m.id == "django_delayjobs.W003"]
    assert bool(found) == warned
    if warned:
        assert "API_CALLBACK_PERMISSIONS" in found[0].msg
        assert "API_PERMISSION_CLASSES" in found[0].msg
    anonymous = client_for(None).post(url("callbacks"), {}, format="json")
    assert (anonymous.status_code == 400) == warned  # let in, and the empty body refused
