"""Audit of the HTTP callbacks, round 6: the status code's three digits, the header names
a caller may give (and what a requeue does with a row holding one now refused), and from a
hostile look at the delivery path, an answer's Content-Length and chunk sizes, which
Python's int() read with signs and underscores.

Every exchange here goes to a real server on 127.0.0.1."""

from __future__ import annotations

import ipaddress

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.urls import reverse

from django_delayjobs import schedule_http
from django_delayjobs.callbacks.delivery import DeliveryFailed, Limits, send
from django_delayjobs.callbacks.policy import parse_url
from django_delayjobs.callbacks.request import InvalidCallback
from django_delayjobs.models import Job, Status
from tests.callback_server import Reply
from tests.test_audit_sec import allow, burst
from tests.test_rest_helpers import client_for, make_user, url

CHANGELIST = "admin:django_delayjobs_job_changelist"
LOOPBACK = [ipaddress.ip_address("127.0.0.1")]
LIMITS = Limits(connect=2, read=2, total=5, keep_bytes=4096)
#: A worker runs outside the test's transaction (``run_delayworker --burst``).
db = pytest.mark.django_db(transaction=True)


def exchange(server, headers=None, body=b'{"a":1}'):
    return send(parse_url(server.url()), LOOPBACK, "POST", headers or {}, body, LIMITS)


# -- 1. a status code is three digits -----------------------------------------------------------


@pytest.mark.parametrize(
    "status_line",
    [
        b"HTTP/1.1 +200 OK",  # int() reads a sign
        b"HTTP/1.1 0200 OK",  # and leading zeros
        b"HTTP/1.1 2_00 OK",  # and underscores between digits
        b"HTTP/1.1 20 OK",
        b"HTTP/1.1\xa0200 OK",  # not whitespace in HTTP (str.split() takes it for one)
        b"HTTP/1.1 200\x1cOK",  # nor is a file separator
    ],
)
def test_a_status_code_that_is_not_three_digits_is_a_bad_status_line(raw_server, status_line):
    """RFC 9112 4: status-code = 3DIGIT. Python's int() read these as 200: a malformed
    status line, which is no answer (network), like any other."""
    server = raw_server(status_line + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    with pytest.raises(DeliveryFailed, match="BadStatusLine") as failed:
        exchange(server)
    assert failed.value.kind == "network"
    assert status_line.decode("iso-8859-1") in str(failed.value)  # as sent, not as int() read


@pytest.mark.parametrize(
    ("status_line", "status", "reason"),
    [
        (b"HTTP/1.1 200 OK", 200, "OK"),
        (b"HTTP/1.1 204", 204, ""),  # the reason phrase may be missing (and its SP)
        (b"HTTP/1.1 503 Service  Unavailable", 503, "Service  Unavailable"),
        (b"HTTP/1.0\t404\tNot Found", 404, "Not Found"),  # RFC 9112 4: HTAB may be read as SP
    ],
)
def test_a_well_formed_status_line_is_still_read(raw_server, status_line, status, reason):
    server = raw_server(status_line + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    response = exchange(server)
    assert (response.status, response.reason) == (status, reason)


def test_an_informational_answer_with_a_bad_status_code_is_a_bad_status_line(raw_server):
    server = raw_server(
        b"HTTP/1.1 +103 Early Hints\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    )
    with pytest.raises(DeliveryFailed, match="BadStatusLine"):
        exchange(server)


# -- 2. header names: what a receiver's server passes on ----------------------------------------

#: Legal RFC 9110 tokens that nginx (``ignore_invalid_headers``, on by default) drops, that
#: Apache drops from a CGI or WSGI environ, and ('_') that gunicorn 22+ drops: the receiver
#: would not get them, and nothing would say so.
DROPPED = [("X.Trace", "X-Trace"), ("X_Trace", "X-Trace"), ("X~Trace", "X-Trace"),
           ("X+Trace", "X-Trace"), ("x!trace", "x-trace"), ("Order#", "Order-"),
           ("X'Trace", "X-Trace"), ("X|Y", "X-Y")]  # fmt: skip


@db
@pytest.mark.parametrize(("name", "spelled"), DROPPED)
def test_a_header_name_that_servers_drop_is_refused_at_the_door(
    name, spelled, settings, callback_server
):
    allow(settings, callback_server)
    said = f"header name {name!r}: write it {spelled!r} (letters, digits and '-' only)"
    with pytest.raises(InvalidCallback) as refused:
        schedule_http(callback_server.url(), in_=0, headers={name: "1"})
    assert refused.value.field == "headers" and str(refused.value).startswith(said)
    api = client_for(make_user(superuser=True))
    body = {"url": callback_server.url(), "in": 0, "headers": {name: "1"}}
    response = api.post(url("callbacks"), body, format="json")
    assert response.status_code == 400 and response.json()["headers"][0].startswith(said)
    assert not Job.objects.exists()


@db
def test_a_header_name_of_letters_digits_and_hyphens_is_sent_as_given(settings, callback_server):
    allow(settings, callback_server)
    job = schedule_http(callback_server.url(), in_=0, headers={"X-Trace-2": "t", "x9": "u"})
    burst()
    job.refresh_from_db()
    assert job.status == Status.SUCCEEDED, job.last_error
    (request,) = callback_server.wait_for(1)
    assert (request.headers["x-trace-2"], request.headers["x9"]) == ("t", "u")


@db
def test_a_stored_header_name_that_servers_drop_ends_the_job_dead_naming_it(
    settings, callback_server
):
    allow(settings, callback_server)
    job = schedule_http(callback_server.url(), in_=0, json={"a": 1})
    Job.objects.filter(pk=job.pk).update(kwargs={**job.kwargs, "headers": {"X.Trace": "1"}})
    burst()
    job.refresh_from_db()
    assert job.status == Status.DEAD
    assert "refused, nothing sent: header name 'X.Trace'" in job.last_error, job.last_error
    assert callback_server.count() == 0


@db
def test_a_destination_header_name_that_servers_drop_is_a_settings_error(settings, callback_server):
    from django_delayjobs.checks import check_settings

    allow(settings, callback_server, HTTP_DESTINATIONS={"hooks": {
        "url": callback_server.url("/base"), "headers": {"X_Tenant": "a"},
    }})  # fmt: skip
    [error] = [e for e in check_settings(None) if "HTTP_DESTINATIONS" in e.msg]
    assert "X_Tenant" in error.msg and "write it 'X-Tenant'" in error.msg, error.msg


# -- 3. requeueing a dead callback whose stored request is refused now ---------------------------


def dead_callback(settings, server, headers: dict[str, str] | None = None) -> Job:
    """A callback job that died at its only attempt: refused for its stored ``headers``
    (a row stored before they were refused), else answered 410 Gone."""
    allow(settings, server)
    server.script("/hook", Reply(410, b"gone"))
    job = schedule_http(server.url(), in_=0, json={"a": 1}, max_attempts=1)
    if headers is not None:
        Job.objects.filter(pk=job.pk).update(kwargs={**job.kwargs, "headers": headers})
    burst()
    job.refresh_from_db()
    assert job.status == Status.DEAD
    return job


REFUSED_AGAIN = "its stored request is refused, whatever the settings"


@db
def test_requeue_refuses_a_dead_callback_whose_stored_request_is_refused(
    settings, callback_server, admin_client
):
    """Requeued, it died again at once for the same reason: the row cannot be edited, so
    a requeue never helps. It is refused, saying why and what to do."""
    job = dead_callback(settings, callback_server, {"X.Trace": "1"})
    response = client_for(make_user(superuser=True)).post(url("jobs", job.pk, "requeue"))
    assert response.status_code == 409
    said = str(response.json())
    assert REFUSED_AGAIN in said and "header name 'X.Trace'" in said
    assert "schedule a new callback" in said
    selection = {"action": "requeue_dead", ACTION_CHECKBOX_NAME: [str(job.pk)], "index": "0"}
    page = admin_client.post(reverse(CHANGELIST), selection, follow=True)
    messages = [str(m) for m in page.context["messages"]]
    assert any(m.startswith(f"Job {job.pk} was not requeued: {REFUSED_AGAIN}") for m in messages)
    job.refresh_from_db()
    assert job.status == Status.DEAD and callback_server.count() == 0


@db
def test_a_dead_callback_with_a_sendable_request_is_requeued(settings, callback_server):
    job = dead_callback(settings, callback_server)
    assert callback_server.count() == 1
    response = client_for(make_user(superuser=True)).post(url("jobs", job.pk, "requeue"))
    assert response.status_code == 200 and response.json()["status"] == Status.SCHEDULED
    burst()
    job.refresh_from_db()
    assert job.status == Status.SUCCEEDED and callback_server.count() == 2


# -- 4. a Content-Length is digits ---------------------------------------------------------------


@pytest.mark.parametrize(
    "length",
    [
        b"+5",  # int() reads a sign
        b"5_0",  # and underscores (50: the body read as cut short)
        b"-1",  # a negative length was read as none: to the close
        b"0x5",  # and one that is no number
        b"5, 6",  # two lengths (urllib3 said so, in its own words)
        b"9" * 5000,  # more digits than int() reads: read to the close, and not "cut short"
    ],
)
def test_an_answer_whose_content_length_is_not_digits_is_no_answer(raw_server, length):
    """RFC 9112 6.3: an invalid Content-Length makes the framing invalid, and a client must
    discard the answer: no answer (network), retried, as a malformed status line is."""
    server = raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: " + length + b"\r\n\r\nhello")
    with pytest.raises(DeliveryFailed, match="Content-Length") as failed:
        exchange(server)
    assert failed.value.kind == "network"
    assert repr(length.decode())[:100] in str(failed.value) and "no answer" in str(failed.value)


@pytest.mark.parametrize(
    ("head", "body"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n", b"hello"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 005\r\n", b"hello"),  # 1*DIGIT
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n", b"hello"),  # RFC 9110 8.6: one
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n", b"hello"),
        # Transfer-Encoding overrides it (RFC 9112 6.3): not read, so not judged
        (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\nTransfer-Encoding: chunked\r\n",
         b"5\r\nhello\r\n0\r\n\r\n"),
        (b"HTTP/1.1 204 No Content\r\nContent-Length: x\r\n", b""),  # no body, whatever it says
    ],
)  # fmt: skip
def test_an_answer_with_a_readable_length_is_read(raw_server, head, body):
    server = raw_server(head + b"\r\n" + body)
    response = exchange(server)
    assert response.body == (b"hello" if body else b"") and not response.truncated


@db
def test_requeue_of_a_callback_that_is_not_dead_says_so_first(settings, callback_server):
    allow(settings, callback_server)
    job = schedule_http(callback_server.url(), in_=60, json={"a": 1})
    Job.objects.filter(pk=job.pk).update(kwargs={**job.kwargs, "headers": {"X.Trace": "1"}})
    response = client_for(make_user(superuser=True)).post(url("jobs", job.pk, "requeue"))
    assert response.status_code == 409
    assert response.json()["detail"] == "Only dead jobs can be requeued."


# -- 5. a chunk's size is hex digits ---------------------------------------------------------------

CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    ("chunks", "body", "truncated"),
    [
        (b"5\r\nhello\r\n0\r\n\r\n", b"hello", False),
        (b"5;name=value\r\nhello\r\n0\r\n\r\n", b"hello", False),  # a chunk extension
        (b"5 ;x\r\nhello\r\n0\r\n\r\n", b"hello", False),  # BWS before it
        (b"A\r\nhelloworld\r\n0\r\n\r\n", b"helloworld", False),
        # int(size, 16) read a sign and underscores: "-5" kept the framing as body
        (b"-5\r\nhello\r\n0\r\n\r\n", b"", True),
        (b"+5\r\nhello\r\n0\r\n\r\n", b"", True),
        (b"5_0\r\nhello\r\n0\r\n\r\n", b"", True),
        (b"5\r\nhello\r\n-0\r\n\r\n", b"hello", True),
    ],
)
def test_a_chunk_size_that_is_not_hex_digits_cuts_the_body_short(
    raw_server, chunks, body, truncated
):
    """RFC 9112 7.1: chunk-size = 1*HEXDIG. The answer stands (its status and headers have
    come); its body ends at a malformed chunk, marked truncated."""
    response = exchange(raw_server(CHUNKED + chunks))
    assert (response.status, response.body, response.truncated) == (200, body, truncated)
