"""Audit of the HTTP callbacks, round 5: header names a receiver reads as one we send, odd
``Retry-After`` values, a 304, and heads of more lines than the HTTP client reads. Real
servers on 127.0.0.1, a private Redis, the real worker (``run_delayworker --burst``)."""

from __future__ import annotations

import pytest

from django_delayjobs import schedule_http
from django_delayjobs.callbacks.request import InvalidCallback
from django_delayjobs.models import Job, Status
from tests.callback_server import Reply
from tests.test_audit_cb2 import history
from tests.test_audit_sec import allow, burst
from tests.test_rest_helpers import client_for, make_user, url

pytestmark = pytest.mark.django_db(transaction=True)

# -- a header name that a receiver reads as one the delivery sends ------------------------------

#: A receiver behind WSGI/CGI (and nginx with underscores_in_headers) reads ``User_Agent``
#: and ``User-Agent`` as one variable: the job's and ours were both sent, either one won.
UNDERSCORED = [("User_Agent", "User-Agent"), ("content_type", "Content-Type"),
               ("ACCEPT_ENCODING", "Accept-Encoding")]  # fmt: skip


@pytest.mark.parametrize(("name", "spelled"), UNDERSCORED)
def test_an_underscored_name_of_a_header_the_delivery_sends_is_refused_at_both_doors(
    name, spelled, settings, callback_server
):
    allow(settings, callback_server)
    with pytest.raises(InvalidCallback, match=f"write it {spelled}") as refused:
        schedule_http(callback_server.url(), in_=0, json={"a": 1}, headers={name: "x"})
    assert refused.value.field == "headers"
    api = client_for(make_user(superuser=True))
    body = {"url": callback_server.url(), "in": 0, "headers": {name: "x"}}
    response = api.post(url("callbacks"), body, format="json")
    assert response.status_code == 400 and f"write it {spelled}" in str(response.json()["headers"])
    assert not Job.objects.exists()


def test_an_underscored_default_header_of_a_destination_is_a_settings_error(
    settings, callback_server
):
    from django_delayjobs.checks import check_settings

    allow(settings, callback_server, HTTP_DESTINATIONS={"hooks": {
        "url": callback_server.url("/base"), "headers": {"User_Agent": "ours"},
    }})  # fmt: skip
    [error] = [e for e in check_settings(None) if "HTTP_DESTINATIONS" in e.msg]
    assert error.id == "django_delayjobs.E009" and "write it User-Agent" in error.msg, error


@pytest.mark.parametrize(
    "headers",
    [{"User_Agent": "mine"}, {"Content_Type": "text/x", "Content-Type": "application/json"}],
)  # the second as the door stored it: its own Content-Type beside the job's
def test_a_stored_underscored_default_header_ends_the_job_dead_naming_it(
    headers, settings, callback_server
):
    allow(settings, callback_server)
    callback_server.script("/hook", Reply(200, b"ok"))
    job = schedule_http(callback_server.url(), in_=0, json={"a": 1})
    Job.objects.filter(pk=job.pk).update(kwargs={**job.kwargs, "headers": headers})
    burst()
    job.refresh_from_db()
    assert job.status == Status.DEAD, job.result
    name = next(iter(headers))
    assert f"refused, nothing sent: header {name}: write it" in job.last_error, job.last_error
    assert callback_server.count() == 0


# -- a Retry-After of leading zeros ---------------------------------------------------------------


@pytest.mark.parametrize(("value", "said"), [("0000000000000", "0 s"), ("0" * 40 + "120", "120 s")])
def test_a_retry_after_with_leading_zeros_is_the_number_it_writes(
    value, said, settings, callback_server
):
    """RFC 9110's delay-seconds is 1*DIGIT: ``0000000000000`` is 0 (the job's backoff,
    60 s here), not a number past every bound (the longest wait, an hour)."""
    allow(settings, callback_server, HTTP_RETRY_AFTER_MAX_SECONDS=3600)
    callback_server.script("/hook", Reply(503, b"later", headers={"Retry-After": value}))
    job = schedule_http(callback_server.url(), in_=0)
    burst()
    job.refresh_from_db()
    assert job.status == Status.RETRYING and f"Retry-After: {said}" in job.last_error
    assert (job.run_at - job.started_at).total_seconds() < 600


# -- a 304 is not a redirect -----------------------------------------------------------------------


def test_a_304_ends_the_job_dead_saying_it_is_no_success_not_a_redirect(settings, raw_server):
    server = raw_server(b'HTTP/1.1 304 Not Modified\r\nETag: "v1"\r\n\r\n')
    allow(settings, server)
    job = schedule_http(server.url(), in_=0, json={"a": 1})
    burst()
    job.refresh_from_db()
    assert job.status == Status.DEAD and "-> 304 Not Modified" in job.last_error
    assert "redirect" not in job.last_error and "only 2xx" in job.last_error, job.last_error


# -- a head of more lines than the HTTP client reads --------------------------------------------


def test_an_answer_of_too_many_header_lines_is_no_answer_that_says_why(settings, raw_server):
    """http.client reads at most 100 header lines, the blank one that ends them included:
    past that, it raised a bare ``HTTPException: got more than 100 headers``, which said
    neither that the receiver had answered nor with what."""
    lines = b"".join(b"X-Filler-%d: x\r\n" % n for n in range(150))
    server = raw_server(b"HTTP/1.1 200 OK\r\n" + lines + b"Content-Length: 0\r\n\r\n")
    allow(settings, server)
    job = schedule_http(server.url(), in_=0, json={"a": 1})
    burst()
    job.refresh_from_db()
    assert job.status == Status.RETRYING, job.result  # the head was not read: no answer
    assert "no answer (network): the answer's head (status 200) has more than" in job.last_error
    assert "header lines" in job.last_error, job.last_error


# -- a malformed status line is kept bounded ----------------------------------------------------


@pytest.mark.parametrize(
    "status_line",
    [b"9" * 60_000, b"HTTP/1.1 " + b"9" * 60_000 + b" OK", b"HTTP/" + b"9" * 60_000 + b" 200 OK",
     b"HTTP/1.1 600 " + b"9" * 60_000],
    ids=["no version", "huge status", "huge version", "reason of a status past 599"],
)  # fmt: skip
def test_a_huge_malformed_status_line_is_no_answer_said_in_few_words(
    status_line, settings, raw_server, caplog
):
    """http.client reads a status line of up to 64 KiB and quotes it whole when it is
    malformed: every attempt wrote it into the job's error, its history and the log (a
    reason phrase is kept to 200 characters)."""
    server = raw_server(status_line + b"\r\nContent-Length: 0\r\n\r\n")
    allow(settings, server)
    job = schedule_http(server.url(), in_=0, json={"a": 1})
    burst()
    job.refresh_from_db()
    assert job.status == Status.RETRYING and "no answer (network)" in job.last_error
    logged = "\n".join(record.getMessage() for record in caplog.records)
    for text in (job.last_error, history(job), logged):
        assert "9" * 1000 not in text
