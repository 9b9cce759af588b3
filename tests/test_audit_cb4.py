"""Audit of the HTTP callbacks, round 4: a receiver that answers before it has read the
whole request, ...

Every exchange here goes to a real server on 127.0.0.1."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Iterator

import pytest
from django.core.management import call_command

from django_delayjobs import schedule_http
from django_delayjobs.callbacks.delivery import DeliveryFailed, Limits, send
from django_delayjobs.callbacks.policy import parse_url
from django_delayjobs.callbacks.signing import new_secret
from django_delayjobs.models import Status
from tests.callback_server import Reply, TcpServer, read_request

LOOPBACK = [ipaddress.ip_address("127.0.0.1")]
BIG = 1 << 20  # the largest body HTTP_MAX_REQUEST_BYTES allows; far past the buffers below
TOO_LARGE = (
    b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 8\r\nConnection: close\r\n\r\ntoo big!"
)


def allow(settings, *netlocs: str, **more: object) -> None:
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": list(netlocs),
        "HTTP_ALLOW_PRIVATE_NETWORKS": True,  # the servers are on 127.0.0.1
        "HTTP_SIGNING_SECRETS": [new_secret()],
        "HTTP_MAX_REQUEST_BYTES": BIG,
        "RETRY_BACKOFF_SECONDS": 60,
        **more,
    }


# -- a receiver that answers early and stops reading ------------------------------------------


class EarlyAnswer(TcpServer):
    """A server that reads a request's head only, answers ``reply`` and closes the
    connection with the body unread (a reset, as any server's close with unread data is):
    what a server that refuses a body too large or a missing credential may do."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.heads: list[bytes] = []
        super().__init__(rcvbuf=4096)  # the client is still sending when the answer comes

    def handle(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            conn.settimeout(5)
            self.heads.append(read_request(conn, whole=False))
            conn.sendall(self.reply)
            # Closed with the body unread: a TCP reset follows the answer.


@pytest.fixture
def early() -> Iterator[list[EarlyAnswer]]:
    servers: list[EarlyAnswer] = []
    yield servers
    for server in servers:
        server.close()


def test_an_answer_sent_before_the_body_was_read_is_the_answer(early):
    """A 413 (or 401) written before the receiver read the body, whose close then breaks
    the pipe we were still writing to, was "no answer (network)" and retried; the answer
    is in the socket, and it is what the receiver said. (Whether the reset comes while we
    are still writing is a race: ten exchanges, of which about half used to fail.)"""
    server = EarlyAnswer(TOO_LARGE)
    early.append(server)
    target = parse_url(f"http://{server.netloc}/hook")
    for _ in range(10):
        response = send(target, LOOPBACK, "POST", {}, b"x" * BIG, Limits(2, 2, 5, 4096))
        assert (response.status, response.body) == (413, b"too big!")
    assert server.heads[0].startswith(b"POST /hook HTTP/1.1")


def test_a_broken_pipe_without_an_answer_is_still_no_answer(early):
    server = EarlyAnswer(b"")  # reads the head, says nothing, closes
    early.append(server)
    target = parse_url(f"http://{server.netloc}/hook")
    with pytest.raises(DeliveryFailed) as failed:
        send(target, LOOPBACK, "POST", {}, b"x" * BIG, Limits(2, 2, 5, 4096))
    assert failed.value.kind == "network"


@pytest.mark.django_db(transaction=True)
def test_a_413_answered_early_ends_the_job_dead_not_retrying(early, settings, redis_client):
    server = EarlyAnswer(TOO_LARGE)
    early.append(server)
    allow(settings, server.netloc)
    body = "x" * (BIG - 4096)  # with the job's kwargs, within MAX_JSON_BYTES
    jobs = [schedule_http(f"http://{server.netloc}/hook", in_=0, data=body) for _ in range(6)]
    call_command("run_delayworker", "--burst", "-v", "0")
    for job in jobs:
        job.refresh_from_db()
        assert job.status == Status.DEAD, job.last_error
        assert "-> 413 Payload Too Large" in job.last_error


# -- a Retry-After sooner than the job's backoff ----------------------------------------------


@pytest.mark.parametrize("value", ["0", "1", "Sun, 06 Nov 1994 08:49:37 GMT"])
@pytest.mark.django_db(transaction=True)
def test_a_retry_after_sooner_than_the_backoff_does_not_hurry_the_retry(
    value, callback_server, settings, redis_client
):
    """A failing receiver answering 503 with ``Retry-After: 0`` (or a date gone by) had its
    job retried at once, every attempt, until dead within a second: a retry waits for the
    later of what the receiver asks and the job's own backoff (60 s here, jittered to
    30-60)."""
    allow(settings, callback_server.netloc)
    callback_server.script("/hook", Reply(503, b"busy", headers={"Retry-After": value}))
    job = schedule_http(callback_server.url(), in_=0)
    call_command("run_delayworker", "--burst", "-v", "0")
    job.refresh_from_db()
    assert job.status == Status.RETRYING and job.attempts == 1, job.last_error
    assert (job.run_at - job.started_at).total_seconds() >= 29
    assert "; Retry-After: " in job.last_error  # what the receiver asked is still said


@pytest.mark.django_db(transaction=True)
def test_a_retry_after_later_than_the_backoff_is_waited_for(
    callback_server, settings, redis_client
):
    allow(settings, callback_server.netloc, RETRY_BACKOFF_SECONDS=1)
    callback_server.script("/hook", Reply(429, b"", headers={"Retry-After": "600"}))
    job = schedule_http(callback_server.url(), in_=0)
    call_command("run_delayworker", "--burst", "-v", "0")
    job.refresh_from_db()
    assert job.status == Status.RETRYING
    assert 595 < (job.run_at - job.started_at).total_seconds() < 605
