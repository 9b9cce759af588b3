"""Callback jobs run by a real (in-process, --burst) worker against a real server on
127.0.0.1: what arrives, how each answer ends the job, and what the history shows."""

from __future__ import annotations

import email.utils
import ipaddress
import threading
import time

import pytest
from django.core.management import call_command
from django.db import connection, connections
from django.test import Client
from django.utils import timezone

from django_delayjobs import schedule_http
from django_delayjobs.callbacks import policy
from django_delayjobs.callbacks.signing import new_secret, signature, verify
from django_delayjobs.models import Job, Status
from tests.callback_server import Reply, json_body
from tests.helpers import planted_callback

pytestmark = pytest.mark.django_db(transaction=True)

SECRET, DEST_SECRET = new_secret(), new_secret()
TOKEN = "Bearer dest-token-7"


@pytest.fixture(autouse=True)
def http(settings, redis_client, callback_server):
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": [callback_server.netloc, f"callback.test:{callback_server.port}"],
        "HTTP_ALLOW_PRIVATE_NETWORKS": True,  # the server is on 127.0.0.1
        "HTTP_SIGNING_SECRETS": [SECRET],
        "HTTP_DESTINATIONS": {
            "local": {
                "url": callback_server.url("/base/"),
                "headers": {"Authorization": TOKEN},
                "signing_secrets": [DEST_SECRET],
            }
        },
        "RETRY_BACKOFF_SECONDS": 0.01,
        "HTTP_READ_TIMEOUT_SECONDS": 2.0,
    }
    return settings


def burst() -> None:
    call_command("run_delayworker", "--burst", "-v", "0")


def run(job: Job, until: tuple[str, ...] = ("succeeded", "dead"), rounds: int = 40) -> Job:
    """Run the worker until the job reaches one of ``until``."""
    for _ in range(rounds):
        burst()
        job.refresh_from_db()
        if job.status in until:
            return job
        time.sleep(0.02)
    raise AssertionError(f"job still {job.status}: {job.last_error}")


def history(job: Job) -> list[tuple[str, str]]:
    return list(job.events.order_by("at", "id").values_list("kind", "message"))


def test_delivery_sends_method_body_and_headers_signed(callback_server):
    job = schedule_http(
        callback_server.url("/orders/42?x=1"),
        method="PUT",
        json={"order": 42, "note": "café"},
        headers={"X-Trace": "t-1"},
        in_=0,
    )
    run(job)
    (request,) = callback_server.requests
    assert (request.method, request.path) == ("PUT", "/orders/42?x=1")
    assert json_body(request) == {"order": 42, "note": "café"}
    assert request.headers["content-type"] == "application/json"
    assert request.headers["x-trace"] == "t-1"
    assert request.headers["webhook-id"] == str(job.pk)
    assert abs(int(request.headers["webhook-timestamp"]) - time.time()) < 30
    assert verify(request.headers, request.body, [SECRET]) == str(job.pk)
    assert job.status == Status.SUCCEEDED and job.attempts == 1
    assert job.result["status"] == 200 and job.result["body"] == '{"ok":true}'
    assert job.result["latency_ms"] > 0 and job.result["address"] == "127.0.0.1"
    kinds = [kind for kind, _ in history(job)]
    assert kinds == ["scheduled", "started", "succeeded"]
    assert history(job)[-1][1].startswith(
        f"PUT {callback_server.url('/orders/42?x=1')} -> 200 OK in "
    )


def test_the_receiving_helper_accepts_it_and_refuses_it_tampered(callback_server):
    job = run(schedule_http(callback_server.url(), json={"order": 7}, in_=0))
    (request, *_) = callback_server.requests
    client = Client()
    headers = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in request.headers.items()
               if k.startswith("webhook-")}  # fmt: skip
    ok = client.post("/hooks/receive/", request.body, content_type="application/json", **headers)
    assert ok.status_code == 200 and ok.json()["webhook_id"] == str(job.pk)
    tampered = request.body.replace(b"7", b"8")
    refused = client.post("/hooks/receive/", tampered, content_type="application/json", **headers)
    assert refused.status_code == 401 and b"no webhook-signature matches" in refused.content
    unsigned = client.post("/hooks/receive/", request.body, content_type="application/json")
    assert unsigned.status_code == 401
    # the async view too, and its own tolerance
    ok = client.post("/hooks/receive-async/", request.body, content_type="application/json",
                     **headers)  # fmt: skip
    assert ok.status_code == 200
    stale = {**headers, "HTTP_WEBHOOK_TIMESTAMP": str(int(time.time()) - 60)}
    stamp = int(stale["HTTP_WEBHOOK_TIMESTAMP"])
    stale["HTTP_WEBHOOK_SIGNATURE"] = signature(SECRET, str(job.pk), stamp, request.body)
    within_300 = client.post("/hooks/receive/", request.body, "application/json", **stale)
    assert within_300.status_code == 200  # 60 s old: within the default 300 s
    not_within_5 = client.post("/hooks/receive-async/", request.body, "application/json", **stale)
    assert not_within_5.status_code == 401


def test_a_destination_adds_its_secret_headers_and_signs_with_its_own_secret(callback_server):
    job = run(schedule_http("local:/hooks/expire?o=1", data="hello", in_=0))
    (request,) = callback_server.requests
    assert request.path == "/base/hooks/expire?o=1" and request.body == b"hello"
    assert request.headers["authorization"] == TOKEN
    assert verify(request.headers, request.body, [DEST_SECRET]) == str(job.pk)
    with pytest.raises(Exception, match="no webhook-signature matches"):
        verify(request.headers, request.body, [SECRET])
    assert "dest-token" not in str(Job.objects.filter(pk=job.pk).values().get())
    assert history(job)[-1][1].startswith("POST local:/hooks/expire?o=1 -> 200 OK")


def test_503_is_retried_then_succeeds_with_the_same_webhook_id(callback_server):
    callback_server.script("/hook", Reply(503, b"busy"), Reply(200, b"done"))
    job = run(schedule_http(callback_server.url(), json={}, in_=0))
    first, second = callback_server.requests
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == str(job.pk)
    assert job.status == Status.SUCCEEDED and job.attempts == 2
    assert job.result["body"] == "done"
    kinds = [kind for kind, _ in history(job)]
    assert kinds == ["scheduled", "started", "failed", "started", "succeeded"]
    failed = dict(history(job))["failed"]
    assert "-> 503 Service Unavailable in " in failed and "body: busy" in failed


@pytest.mark.parametrize(
    ("status", "retried"),
    [(500, True), (502, True), (408, True), (429, True), (404, False), (400, False),
     (401, False), (410, False), (422, False)],
)  # fmt: skip
def test_which_statuses_are_retried(callback_server, settings, status, retried):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "RETRY_BACKOFF_SECONDS": 60}
    callback_server.script("/hook", Reply(status, b"no"))
    job = schedule_http(callback_server.url(), in_=0, max_attempts=5)
    burst()
    job.refresh_from_db()
    assert callback_server.count() == 1
    if retried:
        assert job.status == Status.RETRYING and f"-> {status} " in job.last_error
    else:  # dead at once, attempts left or not
        assert job.status == Status.DEAD and job.attempts == 1
        assert f"-> {status} " in job.last_error and "not retried" in job.last_error
        assert [kind for kind, _ in history(job)][-2:] == ["failed", "dead"]


def test_retried_statuses_are_configurable(callback_server, settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "HTTP_RETRY_STATUSES": [409],
                          "RETRY_BACKOFF_SECONDS": 60}  # fmt: skip
    callback_server.script("/a", Reply(409))
    callback_server.script("/b", Reply(429))
    a = schedule_http(callback_server.url("/a"), in_=0)
    b = schedule_http(callback_server.url("/b"), in_=0)
    burst()
    a.refresh_from_db()
    b.refresh_from_db()
    assert (a.status, b.status) == (Status.RETRYING, Status.DEAD)


@pytest.mark.parametrize("form", ["seconds", "date", "asctime", "-0000"])
def test_retry_after_is_honoured(callback_server, form):
    """Seconds, and the HTTP date in each form RFC 9110 5.6.7 says to accept (asctime:
    "Sun Nov  6 08:49:37 1994", in GMT; it was ignored), and RFC 5322's "-0000" (UTC)."""
    later = time.time() + 30
    value = {
        "seconds": "30",
        "date": email.utils.formatdate(later, usegmt=True),
        "asctime": time.strftime("%a %b %e %H:%M:%S %Y", time.gmtime(later)),
        "-0000": time.strftime("%a, %d %b %Y %H:%M:%S -0000", time.gmtime(later)),
    }[form]
    callback_server.script("/hook", Reply(503, b"", {"Retry-After": value}))
    job = schedule_http(callback_server.url(), in_=0)
    before = timezone.now()
    burst()
    job.refresh_from_db()
    assert job.status == Status.RETRYING
    wait = (job.run_at - before).total_seconds()
    assert 27 < wait < 32, wait
    assert "; Retry-After: " in job.last_error


def test_retry_after_is_bounded(callback_server, settings):
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_RETRY_AFTER_MAX_SECONDS": 5,
        "RETRY_BACKOFF_SECONDS": 1,
    }  # a retry waits at least the backoff
    callback_server.script("/hook", Reply(429, b"", {"Retry-After": "86400"}))
    job = schedule_http(callback_server.url(), in_=0)
    before = timezone.now()
    burst()
    job.refresh_from_db()
    assert 4 < (job.run_at - before).total_seconds() < 7


def test_a_redirect_is_not_followed_and_ends_the_job(callback_server):
    callback_server.script("/hook", Reply(302, b"", {"Location": callback_server.url("/next")}))
    job = schedule_http(callback_server.url(), in_=0, max_attempts=5)
    run(job)
    assert job.status == Status.DEAD and job.attempts == 1
    assert "a redirect is not followed" in job.last_error and "/next" in job.last_error
    time.sleep(0.2)
    assert [r.path for r in callback_server.requests] == ["/hook"]


def test_a_redirect_whose_location_holds_a_nul_ends_the_job_dead_after_one_request(
    callback_server,
):
    """The receiver's header goes into the job's error. PostgreSQL refuses a NUL in text:
    unless it is escaped, the outcome is handed back as if the database were down, the
    request is sent again at every delivery and the job dies for a reason that is not
    true."""
    callback_server.script("/hook", *[Reply(302, b"", {"Location": "/next\x00"})] * 5)
    job = schedule_http(callback_server.url(), in_=0, max_attempts=5)
    burst()
    job.refresh_from_db()
    assert (job.status, job.attempts, job.deliveries) == (Status.DEAD, 1, 1)
    assert "a redirect is not followed (Location: /next\\x00)" in job.last_error
    time.sleep(0.2)
    assert callback_server.count() == 1


def test_a_server_that_never_answers_times_out_and_is_retried(callback_server, settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "HTTP_READ_TIMEOUT_SECONDS": 0.5,
                          "RETRY_BACKOFF_SECONDS": 60}  # fmt: skip
    callback_server.script("/hook", Reply(hang=True))
    job = schedule_http(callback_server.url(), in_=0)
    started = time.monotonic()
    burst()
    assert time.monotonic() - started < 10
    job.refresh_from_db()
    assert job.status == Status.RETRYING
    assert "no answer (timeout)" in job.last_error


def test_a_10_mb_response_is_capped(callback_server, settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "HTTP_RESPONSE_KEEP_BYTES": 2048}
    callback_server.script("/hook", Reply(stream=10_000_000))
    job = run(schedule_http(callback_server.url(), in_=0))
    assert job.status == Status.SUCCEEDED
    assert job.result["body"] == "x" * 2048 + "..." and job.result["truncated"] is True
    assert len(history(job)[-1][1]) < 2048 + 200


def test_cancel_before_the_due_time_means_no_request(callback_server):
    job = schedule_http(callback_server.url(), json={"a": 1}, in_=0.3)
    assert job.cancel()
    time.sleep(0.5)
    burst()
    time.sleep(0.2)
    assert callback_server.count() == 0
    job.refresh_from_db()
    assert job.status == Status.CANCELLED


def test_tls_to_a_name_resolved_through_the_hook(settings, tls_server, tls_ca):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "HTTP_CA_BUNDLE": tls_ca[1],
                          "HTTP_ALLOWED_HOSTS": [f"callback.test:{tls_server.port}"]}  # fmt: skip
    loopback = [ipaddress.ip_address("127.0.0.1")]
    with policy.use_resolver(lambda host, port: loopback if host == "callback.test" else []):
        job = run(schedule_http(f"https://callback.test:{tls_server.port}/tls", in_=0))
    assert job.status == Status.SUCCEEDED
    assert tls_server.requests[0].headers["host"] == f"callback.test:{tls_server.port}"


def test_a_name_that_does_not_resolve_is_retried(callback_server, settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "RETRY_BACKOFF_SECONDS": 60}

    def nowhere(host: str, port: int) -> list[policy.IPAddress]:
        raise OSError("Name or service not known")

    with policy.use_resolver(nowhere):
        job = schedule_http(f"http://callback.test:{callback_server.port}/", in_=0)
        burst()
    job.refresh_from_db()
    assert job.status == Status.RETRYING and "did not resolve" in job.last_error


def test_a_resolver_that_hangs_is_given_up_at_the_connect_timeout(callback_server, settings):
    released = threading.Event()

    def hanging(host: str, port: int) -> list[policy.IPAddress]:
        released.wait(10)
        return [ipaddress.ip_address("127.0.0.1")]

    try:
        with policy.use_resolver(hanging):
            settings.DELAYJOBS = {**settings.DELAYJOBS, "HTTP_CONNECT_TIMEOUT_SECONDS": 0.2}
            started = time.monotonic()
            job = schedule_http(f"http://callback.test:{callback_server.port}/", in_=0)
            settings.DELAYJOBS = {**settings.DELAYJOBS, "RETRY_BACKOFF_SECONDS": 60}
            burst()
            assert time.monotonic() - started < 3  # 0.2 s at delivery (none at the door)
    finally:
        released.set()
    job.refresh_from_db()
    assert job.status == Status.RETRYING
    assert "did not resolve" in job.last_error and "within 0.2 s" in job.last_error
    assert callback_server.count() == 0


def test_a_destination_removed_from_the_settings_ends_the_job(callback_server, settings):
    job = schedule_http("local:/x", in_=0, max_attempts=5)
    settings.DELAYJOBS = {**settings.DELAYJOBS, "HTTP_DESTINATIONS": {}}
    run(job)
    assert job.status == Status.DEAD and "no destination 'local'" in job.last_error
    assert callback_server.count() == 0


@pytest.mark.parametrize(
    "stored",
    [
        {"method": "POST"},
        {"method": "TRACE", "url": "http://127.0.0.1/"},
        {"method": "POST", "url": "http://127.0.0.1/", "destination": "local", "path": "/"},
        {"method": "POST", "url": "http://127.0.0.1/", "headers": {"Authorization": "x"}},
        {"method": "POST", "url": "http://127.0.0.1/", "headers": {"X": "a\r\nb: c"}},
        {"method": "POST", "url": "http://127.0.0.1/", "body": 5},
        {"method": "POST", "url": "http://127.0.0.1/", "extra": 1},
        {"method": "POST", "destination": "local", "path": "/../x"},
        # values of the wrong JSON type: a TypeError at load was retried like a failure
        {"method": "POST", "url": "http://127.0.0.1/", "headers": {"X-A": 1}},
        {"method": "POST", "url": "http://127.0.0.1/", "headers": ["X-A"]},
        {"method": "POST", "url": 5},
    ],
)
def test_a_planted_malformed_row_dies_and_sends_nothing(callback_server, stored):
    job = run(planted_callback(stored, max_attempts=5))
    assert job.status == Status.DEAD and job.attempts == 1
    assert "refused, nothing sent" in job.last_error
    assert callback_server.count() == 0


# -- answers no server framework sends (tests/callback_server.py RawServer) ----------------


def allow(settings, *servers) -> None:
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": [
            *settings.DELAYJOBS["HTTP_ALLOWED_HOSTS"],
            *(s.netloc for s in servers),
        ],
        "RETRY_BACKOFF_SECONDS": 60,  # one attempt per burst
    }


def test_an_early_hints_answer_before_the_final_200_is_not_taken_as_the_answer(
    settings, raw_server
):
    """RFC 9110 15.2: the 103 was taken as the answer and ended the job dead."""
    server = raw_server(
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    )
    allow(settings, server)
    job = schedule_http(server.url(), json={"a": 1}, in_=0, max_attempts=5)
    burst()
    job.refresh_from_db()
    assert len(server.requests) == 1
    assert job.status == Status.SUCCEEDED, job.last_error
    assert job.result["status"] == 200 and job.result["body"] == "ok"


def test_a_retry_after_that_is_not_ascii_digits_is_ignored_and_the_line_recorded(
    settings, raw_server
):
    """'\xb2' (superscript two) is a digit to str.isdigit() but not to float(): the
    ValueError left the attempt instead of its history line."""
    server = raw_server(
        b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: \xb2\r\n"
        b"Content-Length: 4\r\nConnection: close\r\n\r\nbusy"
    )
    allow(settings, server)
    job = schedule_http(server.url(), json={"a": 1}, in_=0, max_attempts=5)
    burst()
    job.refresh_from_db()
    assert len(server.requests) == 1
    assert job.status == Status.RETRYING
    assert "-> 503 Service Unavailable in " in job.last_error, job.last_error
    assert "Retry-After" not in job.last_error


def test_a_200_whose_body_is_cut_by_a_reset_succeeds_truncated_and_is_not_sent_again(
    settings, raw_server
):
    """The receiver answered 200 and its headers, then reset the connection: that was
    "no answer (network)", retried, although the receiver had handled the request."""
    server = raw_server(
        b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nConnection: close\r\n\r\npartial",
        reset=True,
    )
    allow(settings, server)
    job = schedule_http(server.url(), json={"a": 1}, in_=0, max_attempts=5)
    burst()
    job.refresh_from_db()
    assert len(server.requests) == 1
    assert job.status == Status.SUCCEEDED, job.last_error
    assert job.result["status"] == 200 and job.result["truncated"] is True
    assert job.result["body"] == "partial..."


def test_during_a_rotation_a_receiver_holding_only_the_old_secret_still_verifies(
    settings, callback_server
):
    """Rotation as documented: the new secret added first, the receivers updated after.
    Only the first secret signed, so a receiver not yet updated answered 401."""
    old, new = new_secret(), new_secret()
    settings.DELAYJOBS = {**settings.DELAYJOBS, "HTTP_SIGNING_SECRETS": [new, old]}
    job = schedule_http(callback_server.url(), json={"order": 42}, in_=0)
    burst()
    (request,) = callback_server.wait_for(1)
    assert verify(request.headers, request.body, [new]) == str(job.pk)
    assert verify(request.headers, request.body, [old]) == str(job.pk)


@pytest.mark.skipif("os.environ.get('DATABASE_URL') is None",
                    reason="SQLite has no connection to terminate")  # fmt: skip
@pytest.mark.parametrize(
    ("status", "ends"),
    [(b"200 OK", Status.SUCCEEDED), (b"503 Busy", Status.RETRYING), (b"404 No", Status.DEAD)],
)
def test_a_connection_lost_while_the_request_was_in_flight_does_not_send_it_again(
    settings, raw_server, status, ends
):
    """The server ends the worker's idle session while the receiver works (a restart, a
    pooler's or firewall's idle timeout): the answer is recorded on a new connection. It
    was handed back as if the database were down, and the request sent a second time."""
    ended = []

    def answer(conn):
        try:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                    "current_database() AND pid <> pg_backend_pid() AND state = 'idle'"
                )
                ended.extend(cursor.fetchall())
        finally:
            connections.close_all()  # this server thread's
        conn.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    server = raw_server(answer)
    allow(settings, server)
    job = schedule_http(server.url(), json={"a": 1}, in_=0)
    connection.close()  # the test's own session is not the worker's
    try:
        burst()
    finally:
        connection.close()  # ended too, if burst() used it
    assert ended, "the worker's session was not found"
    job = Job.objects.get(pk=job.pk)
    assert (job.status, job.attempts, job.deliveries) == (ends, 1, 1), job.last_error
    assert len(server.requests) == 1
