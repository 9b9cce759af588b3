"""Audit of HTTP callbacks: failing tests first, moved to their modules once fixed."""

from __future__ import annotations

import ipaddress
import time

import pytest

from django_delayjobs.callbacks.delivery import Limits, send
from django_delayjobs.callbacks.policy import parse_url

LOOPBACK = [ipaddress.ip_address("127.0.0.1")]


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n",  # the body ends with the connection
        b"HTTP/1.0 200 OK\r\n\r\n",
    ],
)
def test_a_body_trickled_until_the_close_is_cut_by_the_total_timeout(raw_server, head):
    """An answer that ends the connection hands the socket from the connection to the
    response (http.client sets ``conn.sock`` to None): the timer must still cut it."""

    def trickle(conn):
        conn.sendall(head)
        for _ in range(200):  # one byte every 0.05 s: never a read timeout (0.5 s)
            conn.sendall(b"x")
            time.sleep(0.05)

    server = raw_server(trickle)
    start = time.monotonic()
    response = send(parse_url(server.url()), LOOPBACK, "POST", {}, b"",
                    Limits(connect=1, read=0.5, total=1, keep_bytes=4096))  # fmt: skip
    assert time.monotonic() - start < 2.5
    assert (response.status, response.truncated) == (200, True)
    assert 0 < len(response.body) < 200
