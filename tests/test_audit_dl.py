"""Audit of the health check's and the stats command's bounds: a health check of many
queues on a Redis that answers each call just under its socket timeout took minutes
(longer than any probe waits, so the prober saw a timeout, not why), and
``delayjobs_stats`` with a client that has no socket timeout hung for good on a frozen
Redis. Real redis-servers of the tests' own, stopped with SIGSTOP."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client

from django_delayjobs.embedded import EmbeddedRedis
from tests.test_audit_hlt2 import timeless_cache, within  # noqa: F401 (a fixture)
from tests.test_audit_ops import database_reads, locked_job_table
from tests.test_health import health, names

pytestmark = pytest.mark.django_db(transaction=True)

QUEUES = ",".join(f"q{n}" for n in range(30))


class SlowReplies:
    """A TCP proxy to a redis-server's unix socket that holds each of its replies for
    ``DELAY`` seconds: a Redis (far away, or busy) that answers each call late, yet within
    the client's 1 s socket timeout."""

    DELAY = 0.3

    def __init__(self, path: str) -> None:
        self.path = path
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.listener.accept()
                server = socket.socket(socket.AF_UNIX)
                server.connect(self.path)
                self.conns += [client, server]
                for a, b, delay in ((client, server, 0.0), (server, client, self.DELAY)):
                    threading.Thread(target=self._pipe, args=(a, b, delay), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, delay: float) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                time.sleep(delay)  # the latency, not a wait for an event
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()


@pytest.fixture
def slow_redis(own_redis: EmbeddedRedis, settings: Any) -> Iterator[None]:
    """The jobs' Redis is ``own_redis``, each of its replies held 0.3 s on the way."""
    proxy = SlowReplies(str(own_redis.socket_path))
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": f"redis://127.0.0.1:{proxy.port}/0"}
    try:
        yield
    finally:
        proxy.close()


def health_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "delayjobs-health"]


@pytest.fixture(autouse=True)
def no_check_left() -> Iterator[None]:
    """Each test ends with the health checks it started (module state: test order must not
    matter); its Redis is woken first (the fixtures' SIGCONT)."""
    yield
    for thread in health_threads():
        thread.join(15)
    assert health_threads() == []


def test_a_check_of_many_queues_on_a_slow_redis_ends_at_its_deadline(slow_redis):
    """30 queues on a Redis that answers each call 0.3 s late: the check took half a
    minute, past a probe's timeout. It now answers within its default
    deadline (4 s), the checks made shown as made and the others failing, naming what the
    check was waiting on."""
    started = time.monotonic()
    code, lines = health("--queues", QUEUES, "--min-workers", "0")
    took = time.monotonic() - started
    assert took < 5.5, took
    assert code == 1, lines
    assert len(lines) == 2 + 2 * 30, lines  # every check named, as in a full answer
    late = [line for line in lines if "within the health check's 4 s" in line]
    assert late and all(line.startswith("FAIL") for line in late), lines
    (why,) = {line.split(None, 2)[2] for line in late}  # all given up at the same moment
    assert re.fullmatch(
        r"not checked within the health check's 4 s, waiting on Redis \(the state of queue "
        r"q\d+\)",
        why,
    ), why
    assert names(lines, "ok")[:2] == ["redis", "database"], lines


@pytest.mark.parametrize("via", ["command", "view"])
def test_the_deadline_can_be_given(slow_redis, via):
    """``--timeout`` / ``?timeout=``: a probe that waits 3 s asks for less."""

    def check() -> tuple[int, Any]:
        if via == "command":
            return health("--queues", QUEUES, "--min-workers", "0", "--timeout", "2.5")
        response = Client().get(
            "/delayjobs/health/", {"queues": QUEUES, "min_workers": "0", "timeout": "2.5"}
        )
        return response.status_code, response.json()

    started = time.monotonic()
    code, found = check()
    took = time.monotonic() - started
    assert took < 3.5, took
    if via == "command":
        assert code == 1
        assert any("within the health check's 2.5 s" in line for line in found), found
    else:
        assert code == 503 and found["status"] == "fail"
        assert len(found["checks"]) == 2 + 2 * 30, found


@pytest.mark.parametrize(
    "value", ["true", "True", "-1", "0", "nan", "NaN", "inf", "-inf", "1e400", "100000", " 2",
              "٣", "", "1e-300", "0.4", "4s"],
)  # fmt: skip
def test_a_bad_deadline_is_refused(value):
    with pytest.raises(CommandError) as caught:
        health(f"--timeout={value}")
    assert caught.value.returncode == 2 and "--timeout" in str(caught.value)
    response = Client().get("/delayjobs/health/", {"timeout": value})
    assert response.status_code == 400, response.content


def test_a_deadline_given_twice_is_refused():
    with pytest.raises(CommandError, match="given 2 times") as caught:
        health("--timeout", "2", "--timeout", "3")
    assert caught.value.returncode == 2
    response = Client().get("/delayjobs/health/?timeout=2&timeout=3")
    assert response.status_code == 400


def test_probes_against_a_frozen_redis_leave_no_pile_of_threads(frozen_redis, settings):
    """A probe every moment against a frozen Redis, each given up on at its deadline:
    at most one check's thread is left at any time (the next probe waits for it, within
    its own deadline), and it ends once its call does."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": frozen_redis}
    answers = []
    for _ in range(12):
        started = time.monotonic()
        response = Client().get("/delayjobs/health/", {"timeout": "0.5", "min_workers": "0"})
        answers.append((response.status_code, time.monotonic() - started))
        assert len(health_threads()) <= 1, health_threads()
        time.sleep(0.1)  # the probes' period
    assert all(status == 503 and took < 1 for status, took in answers), answers


def test_a_check_given_up_on_stops_at_its_next_call(slow_redis):
    """30 queues on a Redis that answers each call 0.3 s late, given up on at 1 s: the
    check's thread stops before its next call, not 30 queues later."""
    code, lines = health("--queues", QUEUES, "--min-workers", "0", "--timeout", "1")
    given_up = time.monotonic()
    assert code == 1, lines
    (thread,) = health_threads()
    thread.join(5)
    assert not thread.is_alive()
    assert time.monotonic() - given_up < 1.5  # one call (0.3 s, twice on a slow machine)


def test_the_probe_after_one_given_up_on_says_what_that_one_waits_on(own_redis, settings):
    """The Redis frozen, its client's socket timeout 10 s: a check given up on waits on
    its INFO; the next probe, of a short timeout, says so; once Redis is woken that check
    ends and the next probe answers healthy."""
    assert own_redis.pid is not None
    os.kill(own_redis.pid, signal.SIGSTOP)
    url = f"{own_redis.url}{'&' if '?' in own_redis.url else '?'}socket_timeout=10"
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": url}
    first = health("--timeout", "0.5", "--min-workers", "0")
    second = health("--timeout", "0.5", "--min-workers", "0")
    assert first == (1, [
        f"FAIL {name.ljust(15)}  not checked within the health check's 0.5 s, waiting on Redis "
        "(its INFO)" for name in ("redis", "database", "workers:default", "overdue:default")
    ]), first  # fmt: skip
    assert second[0] == 1 and second[1][0] == (
        "FAIL redis            not checked in time: an earlier health check still waits on "
        "Redis (its INFO)"
    ), second
    os.kill(own_redis.pid, signal.SIGCONT)
    for thread in health_threads():
        thread.join(15)
    assert health_threads() == []
    assert health("--min-workers", "0") == (0, [
        "ok   redis            answers", "ok   database         answers",
        "ok   workers:default  0 live worker process(es), at least 0 wanted",
        "ok   overdue:default  oldest due job waiting 0.0 s, at most 60 s allowed",
    ])  # fmt: skip


def test_a_check_held_by_the_database_ends_at_its_deadline_naming_it():
    """The job table locked (a migration's ALTER TABLE): the database check waits its own
    5 s; a probe that waits 2 s asks for 1 and hears that the database held it."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite's readers are never held by a lock for longer than its busy timeout")
    lock = locked_job_table()
    try:
        started = time.monotonic()
        code, lines = health("--timeout", "1", "--min-workers", "0")
        took = time.monotonic() - started
    finally:
        lock.rollback()
        lock.close()
        for thread in health_threads() + database_reads():
            thread.join(10)
    assert took < 2, took
    assert code == 1 and names(lines, "ok") == ["redis"], lines
    assert "waiting on the database" in lines[1], lines


# -- delayjobs_stats ---------------------------------------------------------------------------


def stats(*args: str) -> tuple[int, str, str]:
    out, err = StringIO(), ""
    try:
        call_command("delayjobs_stats", *args, stdout=out)
        code = 0
    except CommandError as exc:
        code, err = exc.returncode, str(exc)
    return code, out.getvalue(), err


def test_stats_with_a_client_without_a_socket_timeout_fails_at_once(
    timeless_cache: EmbeddedRedis,  # noqa: F811 (the fixture)
) -> None:
    """A django-redis cache without SOCKET_TIMEOUT as CACHE_ALIAS: on a frozen Redis the
    command waited for good. It now refuses such a client at once, saying how to fix it,
    with exit 1 (as the health check fails it, without asking Redis)."""
    assert timeless_cache.pid is not None
    os.kill(timeless_cache.pid, signal.SIGSTOP)
    try:
        done, found = within(10, stats)
    finally:
        os.kill(timeless_cache.pid, signal.SIGCONT)
    assert done, "delayjobs_stats hung on a frozen Redis"
    code, out, err = found[0]
    assert code == 1 and out == "", (code, out)
    assert "no socket timeout" in err and "SOCKET_TIMEOUT" in err, err
