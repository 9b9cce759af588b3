"""Audit of the HTTP callbacks, round 2: environment proxies, redirects, odd answers, what
is kept of an answer, the verify helper's tolerance, and bracketed hosts.

Every delivery here goes to a real server on 127.0.0.1, run by a real (in-process,
``--burst``) worker."""

from __future__ import annotations

import time

import pytest
from django.core.management import call_command

from django_delayjobs import schedule_http
from django_delayjobs.callbacks import policy
from django_delayjobs.callbacks.request import InvalidCallback, load
from django_delayjobs.callbacks.signing import InvalidSignature, new_secret, sign, verify
from django_delayjobs.models import Job, JobEvent, Status
from tests.callback_server import Reply

pytestmark = pytest.mark.django_db(transaction=True)


def allow(settings, *netlocs: str) -> None:
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": list(netlocs),
        "HTTP_ALLOW_PRIVATE_NETWORKS": True,  # the servers are on 127.0.0.1
        "HTTP_SIGNING_SECRETS": [new_secret()],
        "RETRY_BACKOFF_SECONDS": 60,
    }


def run(url: str) -> Job:
    job = schedule_http(url, in_=0, json={"a": 1})
    call_command("run_delayworker", "--burst", "-v", "0")
    job.refresh_from_db()
    return job


def history(job: Job) -> str:
    return "\n".join(JobEvent.objects.filter(job=job).values_list("message", flat=True))


# -- environment proxies are not used ---------------------------------------------------------


@pytest.mark.parametrize("name", ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"])
def test_a_proxy_in_the_environment_is_not_used(
    name, callback_server, raw_server, settings, redis_client, monkeypatch
):
    # A proxy would see the request, not the destination the policy checked.
    proxy = raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    monkeypatch.setenv(name, f"http://{proxy.netloc}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    allow(settings, callback_server.netloc)
    job = run(callback_server.url())
    assert job.status == Status.SUCCEEDED
    assert callback_server.count() == 1 and proxy.requests == []


# -- a redirect's Location is shown without credentials -----------------------------------------


def test_a_redirects_location_is_kept_without_its_credentials(
    callback_server, settings, redis_client
):
    location = "https://robot:hunter2@127.0.0.1/next?token=s3cret&order=42"
    callback_server.script("/hook", Reply(status=302, headers={"Location": location}))
    allow(settings, callback_server.netloc)
    job = run(callback_server.url())
    assert job.status == Status.DEAD and callback_server.count() == 1  # not followed
    assert "a redirect is not followed" in job.last_error
    assert "127.0.0.1/next?token=***&order=42" in job.last_error  # still says where
    for text in (job.last_error, history(job)):
        assert "hunter2" not in text and "s3cret" not in text


# -- answers that are not ordinary ------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "status", "said"),
    [
        (b"just a body, no status line\r\n", Status.RETRYING, "no answer (network)"),
        (b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello", Status.SUCCEEDED, "204"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nbad", Status.SUCCEEDED,
         "200 OK"),
    ],
)  # fmt: skip
def test_an_odd_answer_ends_as_a_recorded_outcome(
    answer, status, said, raw_server, settings, redis_client
):
    server = raw_server(answer)
    allow(settings, server.netloc)
    started = time.monotonic()
    job = run(server.url())
    assert time.monotonic() - started < 5
    assert job.status == status and said in history(job) + job.last_error


# -- the verify helper's tolerance --------------------------------------------------------------


@pytest.mark.parametrize("tolerance", [float("nan"), -1.0])
def test_verify_refuses_an_old_timestamp_whatever_the_tolerance(tolerance):
    secret = new_secret()
    headers = sign("msg_1", b"{}", [secret], timestamp=int(time.time()) - 86_400)
    with pytest.raises(InvalidSignature, match="webhook-timestamp"):
        verify(headers, b"{}", [secret], tolerance=tolerance)


def test_verify_refuses_any_timestamp_when_now_is_not_a_number():
    secret = new_secret()
    headers = sign("msg_1", b"{}", [secret], timestamp=1)
    with pytest.raises(InvalidSignature, match="webhook-timestamp"):
        verify(headers, b"{}", [secret], now=float("nan"))


# -- a bracketed host is an IPv6 address, not a name -----------------------------------------------


@pytest.mark.parametrize("host", ["[v1.callback.test]", "[V7.callback.test]"])
def test_a_bracketed_name_is_refused_not_read_as_a_host_name(
    host, callback_server, settings, redis_client
):
    allow(settings, f"v1.callback.test:{callback_server.port}",
          f"v7.callback.test:{callback_server.port}")  # fmt: skip
    url = f"http://{host}:{callback_server.port}/hook"
    with pytest.raises(policy.Refused, match="IPv6"):
        policy.parse_url(url)
    with pytest.raises(policy.Refused, match="IPv6"):
        schedule_http(url, in_=0)
    assert not Job.objects.exists()
    with pytest.raises(ValueError, match="not a host name"):  # nor as an allowlist entry
        policy.parse_allowed_host(host)


# -- what is kept of an answer is bounded ------------------------------------------------------


def test_a_huge_reason_phrase_is_kept_bounded(raw_server, settings, redis_client, caplog):
    reason = "R" * 60_000  # http.client reads a status line of up to 64 KiB
    server = raw_server(f"HTTP/1.1 503 {reason}\r\nContent-Length: 4\r\n\r\nbusy".encode())
    allow(settings, server.netloc)
    job = run(server.url())
    assert job.status == Status.RETRYING and "-> 503 RRR" in job.last_error
    assert "; body: busy" in job.last_error  # the line still says the rest
    logged = "\n".join(record.getMessage() for record in caplog.records)
    for text in (job.last_error, history(job), logged):
        assert "R" * 1000 not in text


# -- a header name read as a reserved one by a WSGI server ---------------------------------------

#: wsgiref, and gunicorn before 22, read '_' in a header name as '-' (both become
#: HTTP_WEBHOOK_SIGNATURE): a job's ``webhook_signature`` would be joined to, or replace, ours.
UNDERSCORED = [
    ("webhook_signature", "set by the delivery"),
    ("Webhook_Id", "set by the delivery"),
    ("transfer_encoding", "set by the delivery"),
    ("X_Api_Key", "carries a credential"),
]


@pytest.mark.parametrize(("name", "said"), UNDERSCORED)
def test_a_header_name_with_underscores_for_a_reserved_one_is_refused(
    name, said, callback_server, settings, redis_client
):
    allow(settings, callback_server.netloc)
    with pytest.raises(InvalidCallback, match=said):
        schedule_http(callback_server.url(), in_=0, headers={name: "v1,forged"})
    assert not Job.objects.exists()
    with pytest.raises(InvalidCallback, match=said):  # nor sent from a row written anyhow
        load({"method": "POST", "url": callback_server.url(), "headers": {name: "x"}})
