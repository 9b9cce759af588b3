"""Audit of the HTTP callbacks: failing reproductions of bugs (each test fails on the
current code for the reason in its docstring, and passes once the bug is fixed)."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import struct
import threading
import time

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from django_delayjobs import schedule, schedule_http
from django_delayjobs.callbacks import policy
from django_delayjobs.callbacks.action import deliver
from django_delayjobs.callbacks.signing import new_secret, verify
from django_delayjobs.models import Job, Status
from tests.testapp import tasks

from .test_rest_helpers import make_user, url

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = new_secret()


class RawServer:
    """A TCP server on 127.0.0.1 that reads one HTTP request per connection and answers
    it with scripted raw bytes (what an ordinary server framework would not send)."""

    def __init__(self, answer: bytes, reset: bool = False) -> None:
        self.answer = answer
        self.reset = reset  # end the connection with a TCP reset after the answer
        self.requests: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def netloc(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, path: str = "/hook") -> str:
        return f"http://{self.netloc}{path}"

    def _serve(self) -> None:
        while not self.closing.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn, contextlib.suppress(OSError):
                conn.settimeout(5)
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(body) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    body += chunk
                self.requests.append(head + b"\r\n\r\n" + body)
                conn.sendall(self.answer)
                if self.reset:
                    time.sleep(0.3)  # the client has read the status line and headers
                    linger = struct.pack("ii", 1, 0)
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                    continue  # closed by the with: a reset, not a FIN
                conn.shutdown(socket.SHUT_WR)
                time.sleep(0.05)

    def close(self) -> None:
        self.closing.set()
        self.thread.join(2)
        self.sock.close()


@pytest.fixture
def raw_server():
    servers: list[RawServer] = []

    def make(answer: bytes, reset: bool = False) -> RawServer:
        server = RawServer(answer, reset)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


@pytest.fixture(autouse=True)
def http(settings, redis_client, callback_server):
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": [callback_server.netloc],
        "HTTP_ALLOW_PRIVATE_NETWORKS": True,  # the servers are on 127.0.0.1
        "HTTP_SIGNING_SECRETS": [SECRET],
        "RETRY_BACKOFF_SECONDS": 60,
        "HTTP_READ_TIMEOUT_SECONDS": 2.0,
        "HTTP_TIMEOUT_SECONDS": 5.0,
    }
    return settings


def allow(settings, *servers: RawServer) -> None:
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": [
            *settings.DELAYJOBS["HTTP_ALLOWED_HOSTS"],
            *(s.netloc for s in servers),
        ],
    }


def burst() -> None:
    call_command("run_delayworker", "--burst", "-v", "0")


def history(job: Job) -> list[tuple[str, str]]:
    return list(job.events.order_by("at", "id").values_list("kind", "message"))


# -- a planted row whose headers or URL are of the wrong JSON type ------------------------


@pytest.mark.parametrize(
    "stored",
    [
        {"method": "POST", "url": "http://127.0.0.1/", "headers": {"X-A": 1}},
        {"method": "POST", "url": "http://127.0.0.1/", "headers": ["X-A"]},
        {"method": "POST", "url": 5},
    ],
)
def test_a_planted_row_of_the_wrong_types_dies_at_once(callback_server, stored):
    """docs/callbacks.md: "refused by the policy, or a stored request that is malformed:
    dead at once, nothing sent". ``request.load`` lets the ``TypeError`` of
    ``check_headers``/``split_url`` through (request.py:220/229) and ``deliver`` only turns
    ``Refused``/``InvalidCallback`` into ``GiveUp`` (action.py:55-58), so such a row is
    retried with backoff like a passing failure, up to ``max_attempts``. It should die at
    the first attempt with "refused, nothing sent"."""
    job = schedule(deliver, in_=0, kwargs=stored, max_attempts=5)
    burst()
    job.refresh_from_db()
    assert callback_server.count() == 0
    assert (job.status, job.attempts) == (Status.DEAD, 1), (job.status, job.last_error)
    assert "refused, nothing sent" in job.last_error


# -- an informational (1xx) answer before the real one ------------------------------------


def test_an_early_hints_answer_before_the_final_200_is_not_taken_as_the_answer(
    settings, raw_server
):
    """RFC 9110 15.2: a client must parse any number of 1xx answers before the final one.
    ``http.client`` skips only ``100 Continue``, so ``delivery.send`` returns a ``103
    Early Hints`` (or ``102 Processing``) as the answer and ``outcome.judge`` ends the job
    dead ("not retried") although the receiver handled the request and answered 200. The
    job should succeed with the 200."""
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


# -- a Retry-After the worker cannot parse ------------------------------------------------


def test_a_retry_after_of_superscript_digits_leaves_the_attempts_history_line(settings, raw_server):
    """``outcome.retry_after`` takes ``str.isdigit()`` for "a number of seconds"
    (outcome.py:38), but a header is read as Latin-1 and ``"\\xb2"`` (superscript two) is a
    digit to ``isdigit`` while ``float("\\xb2")`` raises ``ValueError``. So a hostile 503
    answer makes ``judge`` raise a ``ValueError`` out of the action: the attempt's error is
    a Python exception instead of the documented history line (``POST ... -> 503 ...``),
    and the admin's last status cannot be read from it. A garbage Retry-After should be
    ignored (the job's own backoff) and the line recorded."""
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


# -- callbacks/ answering with a job that is not a callback -------------------------------


def test_callbacks_create_never_answers_with_a_python_job_holding_the_key(settings):
    """docs/callbacks.md: the callbacks endpoints "see callback jobs only", and
    ``POST callbacks/`` answers 200 with "the active job that already holds key". But
    ``create`` (callbacks/service.py:42) hands the key to ``submit``, which returns any
    active job of that (queue, key) (services.py:160), whatever its action. So when a
    Python job holds the key, the clock service is told 200 with that job (its args and
    kwargs shown) as if its callback were scheduled: no request will ever be sent, and
    ``callbacks/cancel/`` with that id answers 404. It should not report a foreign job as
    the callback (for example a 409 saying the key is held by a job that is not one)."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "HTTP_ALLOWED_HOSTS": ["hooks.example.com"]}
    python_job = schedule(tasks.record, in_=60, args=["private"], key="order-42")
    client = APIClient()
    client.force_login(make_user(superuser=True))
    with policy.use_resolver(lambda host, port: [ipaddress.ip_address("93.184.215.14")]):
        response = client.post(
            url("callbacks"),
            {"url": "https://hooks.example.com/expire", "in": 60, "key": "order-42"},
            format="json",
        )
    answered = response.json().get("id")
    assert answered != str(python_job.pk), (response.status_code, response.json())
    if response.status_code in (200, 201):
        assert Job.objects.get(pk=answered).action == deliver.delayable_name


# -- a 2xx answer whose body the receiver cuts off ------------------------------------------


def test_a_200_whose_body_is_cut_by_a_reset_is_an_answer_not_no_answer(settings, raw_server):
    """The receiver sent ``200 OK`` and its headers, then reset the connection in the
    middle of the body. ``delivery._exchange`` (delivery.py:142-147) counts a body cut
    short as an answer only when the total timeout cut it; a reset (or a broken chunk)
    makes ``send`` raise ``DeliveryFailed`` "network", so the job is retried as "no answer
    (network)" and the request is sent again although the receiver answered 200 (with a
    FIN instead of the reset the same answer succeeds). The documented table: 2xx
    succeeds; only "no answer" (refused, timeout, TLS, DNS) is retried. The job should
    succeed with a truncated body."""
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


# -- a path that leaves its destination on common Java receivers ---------------------------


@pytest.mark.parametrize("path", ["/..;/admin", "/a/..;/..;/admin", "/%2e%2e;/admin"])
def test_a_dot_dot_segment_with_a_path_parameter_cannot_leave_the_destination(settings, path):
    """docs/callbacks.md: the path "may not leave" the destination's URL: ``..`` segments
    (even percent-encoded) are refused, and separators that "some receivers decode" count.
    ``request._check_path`` (request.py:95-105) compares whole segments with
    ``(\\.|%2e){1,2}``, so ``..;`` passes; Tomcat, Jetty and Spring drop the ``;``
    parameter first and read ``/base/..;/admin`` as ``/admin``, outside the destination
    (the classic ``/..;/`` bypass). ``/a;/../b`` is already refused; a ``..`` segment with
    a path parameter should be refused too."""
    from django_delayjobs.callbacks.request import InvalidCallback

    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": ["hooks.example.com"],
        "HTTP_DESTINATIONS": {"shop": {"url": "https://hooks.example.com/shop"}},
    }
    resolver = policy.use_resolver(lambda host, port: [ipaddress.ip_address("93.184.215.14")])
    with resolver, pytest.raises(InvalidCallback):
        schedule_http(f"shop:{path}", in_=60)
    assert not Job.objects.exists()


# -- secret rotation as documented ---------------------------------------------------------


def test_the_documented_rotation_does_not_lock_out_a_receiver_not_yet_updated(
    settings, callback_server
):
    """docs/callbacks.md, Signing: "a secret is rotated by putting the new one first,
    updating the receivers, then removing the old one". But ``signing.sign`` signs with
    ``secrets[0]`` only (signing.py:77-78), so from the first step on, a receiver that
    still holds only the old secret refuses every callback (401, which ends the job dead
    at once). The module's own docstring says several space-separated signatures may be
    sent, and ``verify`` takes up to 16 "(a sender rotating secrets sends two or
    three)": during the rotation every listed secret should sign, so the old receiver
    still verifies the request."""
    old, new = new_secret(), new_secret()
    settings.DELAYJOBS = {**settings.DELAYJOBS, "HTTP_SIGNING_SECRETS": [new, old]}
    job = schedule_http(callback_server.url(), json={"order": 42}, in_=0)
    burst()
    (request,) = callback_server.wait_for(1)
    assert verify(request.headers, request.body, [new]) == str(job.pk)
    assert verify(request.headers, request.body, [old]) == str(job.pk)
