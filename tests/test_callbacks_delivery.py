"""One HTTP exchange (callbacks.delivery) against a real server on 127.0.0.1: what is sent,
what is kept, every timeout, TLS against the host name, and the addresses it connects to."""

from __future__ import annotations

import ipaddress
import socket
import time

import pytest

from django_delayjobs.callbacks.delivery import DeliveryFailed, Limits, send
from django_delayjobs.callbacks.policy import parse_url
from tests.callback_server import Reply

LOOPBACK = [ipaddress.ip_address("127.0.0.1")]
LIMITS = Limits(connect=2, read=2, total=5, keep_bytes=4096)


def deliver(server, path="/hook", method="POST", body=b'{"a":1}', headers=None, limits=LIMITS,
            url=None, addresses=LOOPBACK):  # fmt: skip
    target = parse_url(url or server.url(path))
    return send(target, addresses, method, headers or {}, body, limits)


def test_method_body_and_headers_arrive_as_sent(callback_server):
    response = deliver(callback_server, "/a/b?x=1", "PUT", b'{"order":42}',
                       {"Content-Type": "application/json", "X-Trace": "t-1"})  # fmt: skip
    (request,) = callback_server.wait_for(1)
    assert (request.method, request.path, request.body) == ("PUT", "/a/b?x=1", b'{"order":42}')
    assert request.headers["content-type"] == "application/json"
    assert request.headers["x-trace"] == "t-1"
    assert request.headers["host"] == callback_server.netloc
    assert request.headers["user-agent"] == "django-delayjobs"
    assert request.headers["content-length"] == "12"
    assert (response.status, response.body, response.truncated) == (200, b'{"ok":true}', False)
    assert response.address == "127.0.0.1" and 0 < response.seconds < 5


@pytest.mark.parametrize("method", ["GET", "HEAD", "DELETE", "PATCH"])
def test_every_method_is_sent(callback_server, method):
    response = deliver(callback_server, method=method, body=b"")
    assert callback_server.wait_for(1)[0].method == method
    assert response.status == 200
    assert response.body == (b"" if method == "HEAD" else b'{"ok":true}')


def test_status_headers_and_body_of_a_failure_are_returned(callback_server):
    callback_server.script("/hook", Reply(503, b"busy", {"Retry-After": "7"}))
    response = deliver(callback_server)
    assert (response.status, response.reason, response.body) == (503, "Service Unavailable",
                                                                  b"busy")  # fmt: skip
    assert response.headers["retry-after"] == "7"


def test_a_redirect_is_returned_not_followed(callback_server):
    callback_server.script("/hook", Reply(302, b"", {"Location": callback_server.url("/other")}))
    response = deliver(callback_server)
    assert response.status == 302
    assert response.headers["location"].endswith("/other")
    time.sleep(0.2)
    assert [r.path for r in callback_server.requests] == ["/hook"]


def test_a_10_mb_body_is_read_up_to_the_cap_and_the_rest_is_discarded(callback_server):
    callback_server.script("/hook", Reply(stream=10_000_000))
    start = time.monotonic()
    response = deliver(callback_server, limits=Limits(2, 2, 5, keep_bytes=1000))
    assert response.status == 200 and response.truncated
    assert response.body == b"x" * 1000
    assert time.monotonic() - start < 2
    # the server could not write its 10 MB: the connection was closed after the kept part
    wait = time.monotonic() + 5
    while not callback_server.streamed and time.monotonic() < wait:
        time.sleep(0.01)
    ((sent, ended),) = callback_server.streamed
    assert sent < 10_000_000 and ended != "complete", (sent, ended)


def test_a_server_that_never_answers_trips_the_read_timeout(callback_server):
    callback_server.script("/hook", Reply(hang=True))
    start = time.monotonic()
    with pytest.raises(DeliveryFailed) as failed:
        deliver(callback_server, limits=Limits(connect=1, read=0.5, total=10, keep_bytes=10))
    assert failed.value.kind == "timeout"
    assert 0.4 < time.monotonic() - start < 3
    assert callback_server.count() == 1  # it was sent; the answer never came


def test_a_trickling_answer_is_cut_by_the_total_timeout(callback_server):
    # one byte every 0.1 s: never a read timeout (0.5 s), so only the total (1 s) ends it
    callback_server.script("/hook", Reply(trickle=0.1))
    start = time.monotonic()
    with pytest.raises(DeliveryFailed, match=r"within 1 s \(total\)") as failed:
        deliver(callback_server, limits=Limits(connect=1, read=0.5, total=1, keep_bytes=10))
    assert failed.value.kind == "timeout"
    assert 0.9 < time.monotonic() - start < 2.5


def test_a_refused_connection_is_a_network_failure():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    with pytest.raises(DeliveryFailed) as failed:
        send(parse_url(f"http://127.0.0.1:{port}/"), LOOPBACK, "POST", {}, b"", LIMITS)
    assert failed.value.kind == "network"


def test_the_next_address_is_tried_when_one_refuses(callback_server):
    probe = socket.socket()
    probe.bind(("127.0.0.2", 0))
    probe.close()
    dead = ipaddress.ip_address("127.0.0.2")  # nothing listens on this port there
    response = deliver(callback_server, addresses=[dead, *LOOPBACK])
    assert response.status == 200 and response.address == "127.0.0.1"


def test_the_checked_address_is_used_not_the_name(callback_server):
    # callback.test does not resolve at all: the connection goes to the address given
    response = deliver(callback_server, url=f"http://callback.test:{callback_server.port}/x")
    (request,) = callback_server.wait_for(1)
    assert response.status == 200
    assert request.headers["host"] == f"callback.test:{callback_server.port}"


# -- TLS ----------------------------------------------------------------------------------


def test_tls_is_verified_against_the_host_name_with_sni(tls_server, tls_ca):
    _, ca_file = tls_ca
    limits = Limits(2, 2, 5, 4096, ca_file=ca_file)
    url = f"https://callback.test:{tls_server.port}/secure"
    response = deliver(tls_server, url=url, limits=limits)
    assert response.status == 200
    assert tls_server.wait_for(1)[0].headers["host"] == f"callback.test:{tls_server.port}"


@pytest.mark.parametrize("host", ["other.test", "127.0.0.1"])
def test_a_certificate_for_another_name_is_refused(tls_server, tls_ca, host):
    limits = Limits(2, 2, 5, 4096, ca_file=tls_ca[1])
    with pytest.raises(DeliveryFailed, match="TLS failed") as failed:
        deliver(tls_server, url=f"https://{host}:{tls_server.port}/", limits=limits)
    assert failed.value.kind == "tls"
    time.sleep(0.1)
    assert tls_server.count() == 0


def test_an_unknown_authority_is_refused(tls_server):
    # the system's trust store does not hold the throwaway CA
    with pytest.raises(DeliveryFailed, match="TLS failed"):
        deliver(tls_server, url=f"https://callback.test:{tls_server.port}/")
    assert tls_server.count() == 0


# -- answers no server framework sends: scripted bytes ------------------------------------

FINAL = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


@pytest.mark.parametrize(
    "interim",
    [
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n",
        b"HTTP/1.1 102 Processing\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n\r\n"
        b"HTTP/1.1 199 Misc\r\nX-A: 1\r\n\r\nHTTP/1.1 103 Early Hints\r\n\r\n",
    ],
)
def test_informational_answers_are_read_past_to_the_final_one(raw_server, interim):
    """RFC 9110 15.2: any number of 1xx answers may come before the final one."""
    server = raw_server(interim + FINAL)
    response = deliver(server)
    assert (response.status, response.reason, response.body) == (200, "OK", b"ok")
    assert len(server.requests) == 1


def test_an_endless_stream_of_informational_answers_is_cut_by_the_total_timeout(raw_server):
    def early_hints_forever(conn):
        while True:
            conn.sendall(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n")
            time.sleep(0.01)

    server = raw_server(early_hints_forever)
    start = time.monotonic()
    with pytest.raises(DeliveryFailed, match="total") as failed:
        deliver(server, limits=Limits(connect=2, read=2, total=1, keep_bytes=4096))
    assert failed.value.kind == "timeout"
    assert time.monotonic() - start < 2


@pytest.mark.parametrize(
    "status_line", [b"HTTP/1.1 600 Odd", b"HTTP/1.1 999 Odd", b"HTTP/1.1 20x Odd"]
)
def test_a_status_outside_100_to_599_is_a_bad_status_line_not_an_answer(raw_server, status_line):
    """600-999 were answers (retried as if 5xx); they fail like any malformed status line."""
    server = raw_server(status_line + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    with pytest.raises(DeliveryFailed, match="BadStatusLine") as failed:
        deliver(server)
    assert failed.value.kind == "network"


@pytest.mark.parametrize(
    ("answer", "kept"),
    [
        # a reset in the middle of the body
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\npartial", b"partial"),
        # a broken chunked body
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nZZ\r\n", b"hello"),
    ],
)
def test_a_body_cut_after_the_headers_is_a_truncated_answer_not_no_answer(raw_server, answer, kept):
    server = raw_server(answer, reset=True)
    response = deliver(server)
    assert (response.status, response.body, response.truncated) == (200, kept, True)


def test_a_body_cut_short_by_a_normal_close_is_marked_truncated(raw_server):
    server = raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\nab")
    response = deliver(server)
    assert (response.status, response.body, response.truncated) == (200, b"ab", True)


def test_a_body_ended_by_the_close_without_a_length_is_whole(raw_server):
    server = raw_server(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nabc")
    response = deliver(server)
    assert (response.status, response.body, response.truncated) == (200, b"abc", False)


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n",  # the body ends with the connection
        b"HTTP/1.0 200 OK\r\n\r\n",
    ],
)
def test_a_body_trickled_until_the_close_is_cut_by_the_total_timeout(raw_server, head):
    """An answer that ends the connection hands the socket from the connection to the
    response (http.client sets ``conn.sock`` to None): the timer must still cut it. It
    held the worker's thread until the server stopped (4 KiB at one byte per 9 s: 10 h)."""

    def trickle(conn):
        conn.sendall(head)
        for _ in range(200):  # one byte every 0.05 s: never a read timeout (0.5 s)
            conn.sendall(b"x")
            time.sleep(0.05)

    server = raw_server(trickle)
    start = time.monotonic()
    response = deliver(server, limits=Limits(connect=1, read=0.5, total=1, keep_bytes=4096))
    assert time.monotonic() - start < 2.5
    assert (response.status, response.truncated) == (200, True)
    assert 0 < len(response.body) < 200


@pytest.mark.parametrize("name", ["user-agent", "USER-AGENT", "User-Agent"])
def test_a_user_agent_header_of_any_case_replaces_the_default(raw_server, name):
    server = raw_server(FINAL)
    deliver(server, headers={name: "shop/1.0"})
    (request,) = server.requests
    head = request.partition(b"\r\n\r\n")[0].lower()
    assert head.count(b"\r\nuser-agent:") == 1
    assert b"\r\nuser-agent: shop/1.0" in head


# -- the CA bundle -------------------------------------------------------------------------


@pytest.mark.parametrize("bundle", ["missing", "not-pem"])
def test_a_ca_bundle_that_cannot_be_loaded_is_a_tls_failure(tls_server, tmp_path, bundle):
    path = tmp_path / "ca.pem"
    if bundle == "not-pem":
        path.write_text("not a certificate\n")
    limits = Limits(2, 2, 5, 4096, ca_file=str(path))
    with pytest.raises(DeliveryFailed, match="HTTP_CA_BUNDLE") as failed:
        deliver(tls_server, url=f"https://callback.test:{tls_server.port}/", limits=limits)
    assert failed.value.kind == "tls"
    assert tls_server.count() == 0


# -- the total time, between the TCP connect and the TLS handshake --------------------------


def test_a_total_time_used_up_during_the_connect_stops_before_the_tls_handshake(raw_server):
    """The timer fired while the socket was connecting (nothing to shut down then): the
    handshake must not start, bounded by the connect timeout only. The server never speaks
    TLS, so a handshake would wait the whole connect timeout."""
    from django_delayjobs.callbacks.delivery import _connection, _Deadline

    server = raw_server(lambda conn: time.sleep(5))
    target = parse_url(f"https://callback.test:{server.port}/")
    limits = Limits(connect=3, read=3, total=5, keep_bytes=10)
    conn = _connection(target, LOOPBACK[0], limits, limits.total)
    conn.deadline = deadline = _Deadline(conn, 0)
    deadline.timer.join()
    assert deadline.fired
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="connecting"):
        conn.connect()
    assert time.monotonic() - start < 1
    assert conn.sock is None
