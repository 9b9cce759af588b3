"""Audit of the HTTP callbacks, round 6: the status code's three digits, the header names
a caller may give (and what a requeue does with a row holding one now refused), and a
hostile look at the delivery path.

Every exchange here goes to a real server on 127.0.0.1."""

from __future__ import annotations

import ipaddress

import pytest

from django_delayjobs.callbacks.delivery import DeliveryFailed, Limits, send
from django_delayjobs.callbacks.policy import parse_url

LOOPBACK = [ipaddress.ip_address("127.0.0.1")]
LIMITS = Limits(connect=2, read=2, total=5, keep_bytes=4096)


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
