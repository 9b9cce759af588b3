"""Audit of the REST API, third round: a cancel while Redis does not answer, who may reach
callbacks/ when the settings open it, page sizes, and the seconds of ``in``/``expires``."""

from __future__ import annotations

import ipaddress
import os
import signal
import time

import pytest

from django_delayjobs import schedule, services
from django_delayjobs.connection import SOCKET_TIMEOUT, get_engine, reset_engine
from django_delayjobs.models import Job, Status
from tests.testapp import tasks

from .test_rest_helpers import burst, client_for, make_user, redis_state, url

pytestmark = pytest.mark.django_db(transaction=True)


# -- cancel while Redis does not answer ------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("through", ["python", "api"])
def test_a_cancel_while_redis_does_not_answer_waits_for_one_timeout(own_jobs_redis, through):
    """Redis frozen: the cancel's removal timed out on the job's shard, then read the
    queue directory (for shards of an older count) and timed out again: two timeouts on
    every cancel. The cancel is committed all the same, and the id Redis still holds is
    acked by the worker that claims it once Redis answers again."""
    api = client_for(make_user(superuser=True))
    job = schedule(tasks.record, in_=0, args=["x"])
    assert redis_state(job) in ("pending", "ready")
    assert own_jobs_redis.pid is not None
    reset_engine()  # as in another web process: one that has not just read the directory
    get_engine().client.ping()  # the connection is open: what follows is the read's wait
    os.kill(own_jobs_redis.pid, signal.SIGSTOP)
    started = time.monotonic()
    if through == "api":
        assert api.post(url("jobs", job.pk, "cancel")).status_code == 200
    else:
        assert services.cancel(job)
    took = time.monotonic() - started
    os.kill(own_jobs_redis.pid, signal.SIGCONT)
    assert took < 2 * SOCKET_TIMEOUT, took  # a second wait makes it 2 s at least
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


# -- the seconds of in/expires ---------------------------------------------------------------

HOOK = "https://hooks.example.com/orders/42/expire"
#: What Python's float() reads and no one writes as a number of seconds.
HOSTILE_SECONDS = [
    "nan", "NaN", "inf", "-inf", "Infinity", "1e400", "1_000", " 12 ", "12\n", "\t12",
    "\u0661\u0662", "\uff11\uff12", "0x10", "1,5", "", "12s", "PT12S",
]  # fmt: skip


@pytest.fixture
def api(settings):
    from django.core.cache import cache

    from django_delayjobs.callbacks.signing import new_secret

    settings.DELAYJOBS = {**settings.DELAYJOBS, "HTTP_ALLOWED_HOSTS": ["hooks.example.com"],
                          "HTTP_SIGNING_SECRETS": [new_secret()]}  # fmt: skip
    cache.clear()
    client = client_for(make_user(superuser=True))
    client.raise_request_exception = False  # a 500 is a status to assert on
    return client


def _post(api, where: str, value: object, form: bool):
    """POST ``value`` as the seconds of ``where``: a JSON body, or a form (text)."""
    job = schedule(tasks.record, in_=60, args=["x"])
    path, body = {
        "reschedule": (url("jobs", job.pk, "reschedule"), {"in": value}),
        "callback": (url("callbacks"), {"url": HOOK, "in": value}),
        "callback-expires": (url("callbacks"), {"url": HOOK, "in": 5, "expires": value}),
    }[where]
    return api.post(path, body, format=None if form else "json")


WHERES = ["reschedule", "callback", "callback-expires"]


@pytest.mark.parametrize("where", WHERES)
@pytest.mark.parametrize(
    ("text", "form"),
    # an empty form field is a field not given (HTML's rule, DRF's too)
    [(text, form) for text in HOSTILE_SECONDS for form in (False, True) if text or not form],
)
def test_seconds_are_a_plain_decimal_number(api, where, text, form):
    """``in`` and ``expires`` were read by float(), which takes digits of other scripts,
    group underscores and spaces around: "1_000", " 12 " and "١٢" were taken as 1000 and
    12 seconds, though no one writes them so. Each is a 400 naming the field."""
    from django_delayjobs.callbacks import policy

    field = "expires" if where == "callback-expires" else "in"
    with policy.use_resolver(lambda host, port: [ipaddress.ip_address("93.184.215.14")]):
        response = _post(api, where, text, form)
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert not Job.objects.filter(action__startswith="django_delayjobs.").exists()


@pytest.mark.parametrize("where", WHERES)
@pytest.mark.parametrize("text", ["12", "0", "1.5", ".5", "12.", "1e3", "+12", 12, 1.5])
def test_plain_decimal_seconds_are_taken(api, where, text):
    from django_delayjobs.callbacks import policy

    with policy.use_resolver(lambda host, port: [ipaddress.ip_address("93.184.215.14")]):
        response = _post(api, where, text, form=False)
    if where == "callback-expires" and text == "0":  # not later than the due time
        assert response.status_code == 400 and "expires" in response.json()
    else:
        assert response.status_code in (200, 201), response.content


@pytest.mark.parametrize("where", WHERES)
@pytest.mark.parametrize("raw", ["1e400", "-1e400", "1" * 400])
def test_a_json_number_past_a_float_is_refused_by_field(api, where, raw):
    """A JSON number no float holds (``1e400`` is read as infinity)."""
    from django_delayjobs.callbacks import policy

    field = "expires" if where == "callback-expires" else "in"
    job = schedule(tasks.record, in_=60, args=["x"])
    path, body = {
        "reschedule": (url("jobs", job.pk, "reschedule"), f'{{"in": {raw}}}'),
        "callback": (url("callbacks"), f'{{"url": "{HOOK}", "in": {raw}}}'),
        "callback-expires": (url("callbacks"), f'{{"url": "{HOOK}", "in": 5, "expires": {raw}}}'),
    }[where]
    with policy.use_resolver(lambda host, port: [ipaddress.ip_address("93.184.215.14")]):
        response = api.post(path, body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()


# -- pages -------------------------------------------------------------------------------------


@pytest.mark.parametrize("offset", ["1001", "1000000000", "9" * 40])
def test_an_events_cursor_with_an_offset_no_link_gives_is_refused(offset):
    """DRF reads the offset of an events cursor up to 1,000 and takes a larger one as
    1,000: a forged ``o=1000000000`` was answered 200, though the docs say a cursor the
    API did not write is a 400 (as ``jobs/`` answers). Page sizes are capped (1-500)."""
    import base64

    api = client_for(make_user(superuser=True))
    job = schedule(tasks.record, in_=60, args=["x"])
    events = url("jobs", job.pk, "events")
    forged = base64.b64encode(f"o={offset}&p=1".encode()).decode()
    assert api.get(events, {"cursor": forged}).status_code == 400
    fine = base64.b64encode(b"o=1&p=1").decode()  # as DRF writes it, for ties
    assert api.get(events, {"cursor": fine}).status_code == 200
    for where in (url("jobs"), events):
        assert api.get(where, {"page_size": str(10**9)}).status_code == 400
        assert api.get(where, {"page_size": "500"}).status_code == 200
