"""Audit of the HTTP callbacks against hostile receivers: an answer whose connection is
held open, TLS connections ended without close_notify (after a complete answer, in a
body without a length, in the handshake, or while the request is sent), bodies far past
the kept bytes, a header or status line that never ends or is cut short by a close, a
redirect to a host the policy forbids, and heads or handshakes dripped a byte at a time.

Every exchange here goes to a real server on 127.0.0.1 (plain TCP or TLS with a
throwaway CA, trusted through ``Limits.ca_file``, which is ``HTTP_CA_BUNDLE``)."""

from __future__ import annotations

import contextlib
import ipaddress
import re
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from django.core.management import call_command

from django_delayjobs import schedule_http
from django_delayjobs.callbacks import policy
from django_delayjobs.callbacks.delivery import DeliveryFailed, Limits, send
from django_delayjobs.callbacks.policy import parse_url
from django_delayjobs.callbacks.signing import new_secret
from django_delayjobs.models import Status
from tests.callback_server import Reply, TcpServer, read_request

LOOPBACK = [ipaddress.ip_address("127.0.0.1")]
# A read timeout far longer than any assertion's bound: an exchange that waits for it is
# seen waiting; the total time is longer still.
SLOW = dict(connect=2.0, read=8.0, total=12.0, keep_bytes=4096)


class Hostile(TcpServer):
    """Hands each connection to ``behave(conn)``, in its own thread, and keeps it open
    until the test ends (a receiver that never closes)."""

    def __init__(self, behave: Callable[[socket.socket], object], rcvbuf: int = 0) -> None:
        self.behave = behave
        super().__init__(rcvbuf)

    def handle(self, conn: socket.socket) -> None:
        threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            conn.settimeout(10)
            kept = self.behave(conn)  # a TLS socket it wrapped, which owns the connection
            self.closing.wait(30)  # held open: no FIN until the test is over
            if isinstance(kept, socket.socket):
                kept.close()


@pytest.fixture
def hostile() -> Iterator[Callable[..., Hostile]]:
    servers: list[Hostile] = []

    def make(behave: Callable[[socket.socket], object], rcvbuf: int = 0) -> Hostile:
        servers.append(Hostile(behave, rcvbuf))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def exchange(server: Hostile, scheme: str = "http", ca_file: str | None = None, **limits):
    host = "callback.test" if scheme == "https" else "127.0.0.1"
    target = parse_url(f"{scheme}://{host}:{server.port}/hook")
    return send(target, LOOPBACK, "POST", {}, b'{"a":1}', Limits(**{**SLOW, **limits},
                                                                  ca_file=ca_file))  # fmt: skip


def timed(call: Callable[[], object]) -> tuple[object, float]:
    start = time.monotonic()
    return call(), time.monotonic() - start


# -- 1. a complete answer on a connection the receiver keeps open ------------------------------

CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
COMPLETE = {
    "content-length": (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", b"ok"),
    "empty": (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", b""),
    "204": (b"HTTP/1.1 204 No Content\r\n\r\n", b""),
    "chunked": (CHUNKED + b"2\r\nok\r\n0\r\n\r\n", b"ok"),
    "exactly-kept": (b"HTTP/1.1 200 OK\r\nContent-Length: 4096\r\n\r\n" + b"k" * 4096, b"k" * 4096),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(COMPLETE))
def test_a_complete_answer_on_a_connection_held_open_is_taken_at_once(hostile, name):
    answer, body = COMPLETE[name]

    def answer_and_hold(conn):
        read_request(conn)
        conn.sendall(answer)

    server = hostile(answer_and_hold)
    response, seconds = timed(lambda: exchange(server))
    assert (response.status, response.body, response.truncated) == (
        int(answer[9:12]), body, False,
    )  # fmt: skip
    assert seconds < 4, "waited for the read timeout (8 s) though the body was complete"


# -- 2. TLS: an EOF without close_notify -------------------------------------------------------


@pytest.fixture
def tls_context(tls_ca) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls_ca[0].issue_cert("callback.test").configure_cert(context)
    return context


def over_tls(context: ssl.SSLContext, answer: bytes, *, hold: bool):
    """Handshake, read the request, answer; then hold the connection open, or end it with
    a TCP FIN and no close_notify (what a crashed or careless TLS server does)."""

    def behave(conn: socket.socket) -> ssl.SSLSocket:
        tls = context.wrap_socket(conn, server_side=True)
        read_request(tls)
        tls.sendall(answer)
        if not hold:
            socket.socket.shutdown(tls, socket.SHUT_RDWR)  # the TCP socket's, not unwrap()
        return tls  # held by the server until the test ends

    return behave


@pytest.mark.parametrize("hold", [True, False], ids=["held-open", "eof-no-close-notify"])
@pytest.mark.parametrize("name", ["content-length", "chunked", "empty"])
def test_a_complete_answer_over_tls_is_delivered_however_the_connection_ends(
    hostile, tls_context, tls_ca, name, hold
):
    answer, body = COMPLETE[name]
    server = hostile(over_tls(tls_context, answer, hold=hold))
    response, seconds = timed(lambda: exchange(server, "https", tls_ca[1]))
    assert (response.status, response.body, response.truncated) == (200, body, False)
    assert seconds < 4


def test_an_answer_cut_by_an_eof_without_close_notify_is_marked_truncated(
    hostile, tls_context, tls_ca
):
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nok"
    server = hostile(over_tls(tls_context, answer, hold=False))
    response = exchange(server, "https", tls_ca[1])
    assert (response.status, response.body, response.truncated) == (200, b"ok", True)


@pytest.mark.parametrize(
    ("close_notify", "truncated"), [(False, True), (True, False)], ids=["eof", "close-notify"]
)
def test_a_body_ended_by_the_close_over_tls_is_whole_only_after_close_notify(
    hostile, tls_context, tls_ca, close_notify, truncated
):
    """RFC 9112 9.8: a body without a length ends with the connection, and over TLS only a
    close_notify says it ended there; a bare EOF may be an attacker cutting it short. Such
    a body was marked whole (Python's ssl reads a bare EOF as the end by default)."""

    def behave(conn: socket.socket) -> ssl.SSLSocket:
        tls = context.wrap_socket(conn, server_side=True)
        read_request(tls)
        tls.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
        if close_notify:
            with contextlib.suppress(OSError):  # waits for the client's, which never comes
                tls.unwrap()
        else:
            socket.socket.shutdown(tls, socket.SHUT_RDWR)
        return tls

    context = tls_context
    server = hostile(behave)
    response, seconds = timed(lambda: exchange(server, "https", tls_ca[1]))
    assert (response.status, response.body, response.truncated) == (200, b"all of it", truncated)
    assert seconds < 4


def read_client_hello(conn: socket.socket) -> None:
    header = conn.recv(5, socket.MSG_WAITALL)
    (length,) = struct.unpack("!H", header[3:5])
    conn.recv(length, socket.MSG_WAITALL)


def eof_in_handshake(conn: socket.socket) -> None:
    read_client_hello(conn)
    conn.shutdown(socket.SHUT_RDWR)  # a FIN where the ServerHello should be


def reset_in_handshake(conn: socket.socket) -> None:
    read_client_hello(conn)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()  # a TCP reset: a TLS terminator that will not serve this name


def plain_http_on_the_tls_port(conn: socket.socket) -> None:
    read_client_hello(conn)
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")


@pytest.mark.parametrize(
    ("behave", "said"),
    [
        (eof_in_handshake, "closed"),
        (reset_in_handshake, "reset"),
        (plain_http_on_the_tls_port, "WRONG_VERSION_NUMBER"),
    ],
)
def test_a_connection_ended_in_the_tls_handshake_is_a_tls_failure(hostile, tls_ca, behave, said):
    """The TCP connect succeeded and the handshake did not: the failure is TLS's. A reset
    there was "no answer (network): ConnectionResetError", which sends an operator to look
    at the network rather than at the receiver's TLS set-up."""
    server = hostile(behave)
    with pytest.raises(DeliveryFailed) as failed:
        exchange(server, "https", tls_ca[1])
    assert failed.value.kind == "tls"
    assert "TLS failed in the handshake" in str(failed.value) and said in str(failed.value)


def closed_after_the_head(context: ssl.SSLContext, close_notify: bool):
    def behave(conn: socket.socket) -> None:
        with context.wrap_socket(conn, server_side=True) as tls:
            read_request(tls, whole=False)  # the body is left unread: the client still sends
            if close_notify:
                with contextlib.suppress(OSError):  # the client's data comes after ours
                    tls.unwrap()
        # closed with the body unread: the kernel ends the connection with a reset

    return behave


@pytest.mark.parametrize("close_notify", [False, True], ids=["eof", "close-notify"])
def test_a_tls_receiver_that_closes_while_the_request_is_sent_is_no_answer_not_tls(
    hostile, tls_context, tls_ca, close_notify
):
    """The handshake was done; the receiver closed before it read the body, and said
    nothing. Over plain HTTP that is "no answer (network): BrokenPipeError"; over TLS the
    write's EOF was "no answer (tls): TLS failed: EOF occurred in violation of protocol",
    even when the receiver had closed with close_notify as TLS asks."""
    server = hostile(closed_after_the_head(tls_context, close_notify), rcvbuf=4096)
    target = parse_url(f"https://callback.test:{server.port}/hook")
    limits = Limits(**SLOW, ca_file=tls_ca[1])
    with pytest.raises(DeliveryFailed) as failed:
        send(target, LOOPBACK, "POST", {}, b"x" * (16 << 20), limits)  # past every buffer
    assert failed.value.kind == "network", failed.value
    # the close with the body unread is a reset: the write sees an EOF or the reset
    assert re.search(r"receiver (closed|reset) the connection before answering", str(failed.value))
    assert "TLS failed" not in str(failed.value)


def test_a_tls_handshake_that_never_ends_is_a_timeout(hostile, tls_ca):
    server = hostile(read_client_hello)  # then says nothing
    with pytest.raises(DeliveryFailed) as failed:
        exchange(server, "https", tls_ca[1], connect=0.5)
    assert failed.value.kind == "timeout"


def test_a_tls_handshake_dripped_a_byte_at_a_time_is_bounded_by_the_connect_timeout(
    hostile, tls_ca
):
    """A record header that announces 16 KiB, then a byte every 0.2 s: each read of the
    handshake gets data long before the read timeout (8 s)."""

    def drip(conn: socket.socket) -> None:
        read_client_hello(conn)
        conn.sendall(b"\x16\x03\x03\x40\x00")
        for _ in range(100):
            conn.sendall(b"\x02")
            time.sleep(0.2)

    server = hostile(drip)
    start = time.monotonic()
    with pytest.raises(DeliveryFailed) as failed:
        exchange(server, "https", tls_ca[1], connect=0.5)
    assert failed.value.kind == "timeout"
    assert time.monotonic() - start < 4


@pytest.mark.django_db(transaction=True)
def test_through_the_worker_tls_endings_are_recorded_as_what_happened(
    hostile, tls_context, tls_ca, settings, redis_client
):
    """A complete answer then an EOF without close_notify: succeeded. A reset in the
    handshake: retried, its history line naming the TLS handshake."""
    answered = hostile(over_tls(tls_context, COMPLETE["content-length"][0], hold=False))
    reset = hostile(reset_in_handshake)
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": [f"callback.test:{answered.port}", f"callback.test:{reset.port}"],
        "HTTP_ALLOW_PRIVATE_NETWORKS": True,
        "HTTP_SIGNING_SECRETS": [new_secret()],
        "HTTP_CA_BUNDLE": tls_ca[1],
        "RETRY_BACKOFF_SECONDS": 60,
    }
    with policy.use_resolver(lambda host, port: LOOPBACK):
        good = schedule_http(f"https://callback.test:{answered.port}/hook", in_=0)
        bad = schedule_http(f"https://callback.test:{reset.port}/hook", in_=0)
        call_command("run_delayworker", "--burst", "-v", "0")
    good.refresh_from_db()
    bad.refresh_from_db()
    assert good.status == Status.SUCCEEDED, good.last_error
    assert (good.result["status"], good.result["body"], good.result["truncated"]) == (
        200, "ok", False,
    )  # fmt: skip
    assert bad.status == Status.RETRYING
    assert "no answer (tls): TLS failed in the handshake: the receiver reset" in bad.last_error


# -- 3. bodies far past the kept bytes, endless lines, drips ----------------------------------


def endless(head: bytes, piece: bytes, ended: threading.Event | None = None):
    def behave(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(head)
        try:
            while True:  # until the client closes: then a write fails
                conn.sendall(piece)
        except OSError:
            if ended is not None:
                ended.set()

    return behave


@pytest.mark.parametrize(
    ("head", "piece"),
    [
        (CHUNKED, b"10000\r\n" + b"y" * 65536 + b"\r\n"),
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", b"z" * 65536),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999\r\n\r\n", b"x" * 65536),
    ],
    ids=["chunked", "until-close", "huge-length"],
)  # fmt: skip
def test_an_endless_body_is_cut_at_the_kept_bytes_not_read_on(hostile, head, piece):
    ended = threading.Event()
    server = hostile(endless(head, piece, ended))
    response, seconds = timed(lambda: exchange(server, keep_bytes=1000))
    assert (response.status, len(response.body), response.truncated) == (200, 1000, True)
    assert seconds < 4
    assert ended.wait(4), "the rest of the body is still being read"  # the client closed


@pytest.mark.parametrize(
    ("head", "said"),
    [
        (b"HTTP/1.1 200 OK\r\nX-Endless: ", "header line"),
        (b"HTTP/1.1 200 OK\r\n", "more than 99 header lines"),
        (b"HTTP/1.1 200 ", "status line"),
    ],
)
def test_a_head_that_never_ends_is_no_answer_at_once(hostile, head, said):
    piece = b"X-A: 1\r\n" * 1000 if head.endswith(b"\r\n") else b"a" * 65536
    server = hostile(endless(head, piece))
    start = time.monotonic()
    with pytest.raises(DeliveryFailed, match=said) as failed:
        exchange(server)
    assert failed.value.kind == "network"
    assert time.monotonic() - start < 4  # cut at 64 KiB (100 lines), not at a timeout


@pytest.mark.parametrize("head", [b"", b"HTTP/1.1 200 OK\r\nX-Slow: "])
def test_a_head_dripped_a_byte_at_a_time_is_cut_by_the_total_time(hostile, head):
    """A byte every 0.2 s: never a read timeout (1 s), so only the total time (1.5 s) ends
    it; without it, a worker's thread is held for as long as the receiver likes."""

    def drip(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(head)
        for byte in b"HTTP/1.1 200 OK\r\n" if not head else b"a" * 1000:
            conn.sendall(bytes([byte]))
            time.sleep(0.2)

    server = hostile(drip)
    start = time.monotonic()
    with pytest.raises(DeliveryFailed, match="total") as failed:
        exchange(server, read=1.0, total=1.5)
    assert failed.value.kind == "timeout"
    assert time.monotonic() - start < 4


@pytest.mark.parametrize(
    "status_line",
    [b"\x00\x01\x02\xff\xfe", b"garbage", b"HTTP/1.1", b"HTTP/1.1 2000 OK", b"ICY 200 OK"],
)
def test_a_status_line_of_garbage_is_no_answer(hostile, status_line):
    def answer(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(status_line + b"\r\nContent-Length: 0\r\n\r\n")

    server = hostile(answer)
    with pytest.raises(DeliveryFailed, match="BadStatusLine") as failed:
        exchange(server)
    assert failed.value.kind == "network"


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK",  # the status line itself cut short
        b"HTTP/1.1 200 OK\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Le",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n",
        b"HTTP/1.1 410 Gone\r\nX-Reason: moved\r\n",
    ],
)
def test_a_head_cut_short_by_the_close_is_no_answer(hostile, head):
    """RFC 9112 8: a response that ends in its header section is incomplete, and its status
    may not mean what it says. A close there was taken as a whole answer (a 200 that
    succeeded the job, a 410 that ended it dead), where a head cut by the total time is
    no answer; the docs say a close before the status and headers is no answer."""

    def cut(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(head)
        conn.shutdown(socket.SHUT_WR)  # a FIN: no blank line ends the head

    server = hostile(cut)
    with pytest.raises(DeliveryFailed, match="before the end of the answer's head") as failed:
        exchange(server)
    assert failed.value.kind == "network"


@pytest.mark.django_db(transaction=True)
def test_a_200_whose_head_was_cut_short_is_retried_not_succeeded(hostile, settings, redis_client):
    def cut(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        conn.shutdown(socket.SHUT_WR)

    server = hostile(cut)
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": [server.netloc],
        "HTTP_ALLOW_PRIVATE_NETWORKS": True,
        "HTTP_SIGNING_SECRETS": [new_secret()],
        "RETRY_BACKOFF_SECONDS": 60,
    }
    job = schedule_http(f"http://{server.netloc}/hook", in_=0, json={"a": 1})
    call_command("run_delayworker", "--burst", "-v", "0")
    job.refresh_from_db()
    assert job.status == Status.RETRYING, job.result
    assert "no answer (network)" in job.last_error


# -- a redirect to a host the policy forbids ---------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_to_a_forbidden_host_sends_nothing_there(
    status, callback_server, raw_server, settings, redis_client
):
    forbidden = raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    callback_server.script(
        "/hook", Reply(status=status, headers={"Location": forbidden.url("/internal")})
    )
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": [callback_server.netloc],  # not the forbidden one
        "HTTP_ALLOW_PRIVATE_NETWORKS": True,
        "HTTP_SIGNING_SECRETS": [new_secret()],
    }
    job = schedule_http(callback_server.url(), in_=0, json={"a": 1})
    call_command("run_delayworker", "--burst", "-v", "0")
    job.refresh_from_db()
    assert job.status == Status.DEAD and "a redirect is not followed" in job.last_error
    assert callback_server.count() == 1 and forbidden.requests == []
