"""Audit of HTTP callbacks: failing tests first, moved to their modules once fixed."""

from __future__ import annotations

import os

import pytest
from django.db import connection, connections

from django_delayjobs import schedule_http
from django_delayjobs.models import Job, Status
from tests.test_callbacks_e2e import allow, burst, http  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.skipif("os.environ.get('DATABASE_URL') is None",
                    reason="SQLite has no connection to terminate")  # fmt: skip
def test_a_connection_lost_while_the_request_was_in_flight_does_not_send_it_again(
    settings, raw_server
):
    """The server ends the worker's idle session while the receiver works (a restart, a
    pooler's or firewall's idle timeout): the answer is recorded on a new connection. It
    was handed back as if the database were down, and the request sent a second time."""
    ended = []

    def answer(conn):
        try:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                    "current_database() AND pid <> pg_backend_pid() AND state = 'idle'"
                )
                ended.extend(cursor.fetchall())
        finally:
            connections.close_all()  # this server thread's
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

    server = raw_server(answer)
    allow(settings, server)
    job = schedule_http(server.url(), json={"a": 1}, in_=0)
    connection.close()  # the test's own session is not the worker's
    try:
        burst()
    finally:
        connection.close()  # ended too, if burst() used it
    assert ended, "the worker's session was not found"
    job = Job.objects.get(pk=job.pk)
    assert (job.status, job.attempts, job.deliveries) == (Status.SUCCEEDED, 1, 1)
    assert len(server.requests) == 1
    assert job.result["status"] == 200


assert os  # the skipif string reads it
