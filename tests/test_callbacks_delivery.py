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
