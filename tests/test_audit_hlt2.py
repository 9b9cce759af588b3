"""Audit of the health check (``delayjobs_health`` and the ``health/`` view): a Redis
that is full with an evicting policy and nothing left to evict, a Redis client with no
socket timeout on a Redis that stops answering, a reason of several lines, a database
role that may read the job table but not write it, and an option given twice."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from typing import Any

import pytest
import redis
from django.core.management import CommandError
from django.db import connections
from django.test import Client
from django_redis.pool import ConnectionFactory

from django_delayjobs.connection import get_engine, reset_engine
from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.engine import EngineUnavailable
from tests.helpers import database_down
from tests.test_health import health, names, private_redis  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("policy", ["volatile-lru", "volatile-ttl", "noeviction"])
def test_a_full_redis_that_has_nothing_to_evict_fails(request: Any, policy: str) -> None:
    """At ``maxmemory`` with a ``volatile-*`` policy and no key with a time to live (the
    jobs' keys have none), Redis evicts nothing and refuses every new job with OOM: the
    check said ok (it took only ``noeviction`` for full, and its probe was a ``DEL``,
    which Redis runs even when full). Its probe is now a write that Redis refuses when
    full, and it still changes nothing."""
    client: redis.Redis = request.getfixturevalue("private_redis")
    client.config_set("maxmemory-policy", policy)
    client.config_set("maxmemory", 1)
    try:
        with pytest.raises(EngineUnavailable, match="maxmemory"):
            get_engine().add("default", {"job": 1})
        code, lines = health()
    finally:
        client.config_set("maxmemory", 0)
    assert code == 1 and names(lines, "FAIL") == ["redis"], lines
    assert "refuses writes" in lines[0] or "full" in lines[0], lines[0]
    assert "maxmemory" in lines[0], lines[0]
    assert names(lines, "ok") == ["database", "workers:default", "overdue:default"]
    assert health()[0] == 0
    assert client.keys("*write-probe*") == []  # the probe wrote nothing


def test_the_write_probe_changes_nothing(request: Any) -> None:
    """The probe leaves no key behind, and is not replicated (nothing changed)."""
    client: redis.Redis = request.getfixturevalue("private_redis")
    before = client.info("stats")["total_commands_processed"]
    dirty = client.info("persistence")["rdb_changes_since_last_save"]
    assert health()[0] == 0
    assert client.info("stats")["total_commands_processed"] > before
    assert client.info("persistence")["rdb_changes_since_last_save"] == dirty
    assert client.keys("*write-probe*") == []


@pytest.fixture
def timeless_cache(own_redis: EmbeddedRedis, settings: Any, monkeypatch: Any) -> EmbeddedRedis:
    """The jobs' Redis is ``own_redis``, through a django-redis cache whose pool has no
    socket timeout (as redis-py before 8 gives by default)."""
    settings.CACHES = {
        **settings.CACHES,
        "jobs": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": own_redis.url,
                 "OPTIONS": {"CONNECTION_POOL_KWARGS": {"socket_timeout": None}}},
    }  # fmt: skip
    settings.DELAYJOBS = {**settings.DELAYJOBS, "CACHE_ALIAS": "jobs"}
    monkeypatch.setattr(ConnectionFactory, "_pools", {})  # one pool per URL, per process
    reset_engine()
    return own_redis


def within(seconds: float, fn: Any) -> tuple[bool, list[Any]]:
    """Run ``fn`` in a thread; whether it returned within ``seconds``, and its result."""
    found: list[Any] = []
    thread = threading.Thread(target=lambda: found.append(fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive(), found


@pytest.mark.parametrize("via", ["command", "view"])
def test_a_client_without_a_socket_timeout_fails_at_once(timeless_cache: EmbeddedRedis, via):
    """A Redis client with no socket timeout waits for ever on a Redis that stops
    answering (frozen, or cut off with no reset): the probe, or the web worker serving
    ``health/``, hung for good, past every bound the checks promise (``run_delayworker``
    refuses such a client at start). The ``redis`` check now fails at once, saying why,
    without asking Redis; the queue checks are not made; the database is checked."""
    assert timeless_cache.pid is not None

    def check() -> Any:
        if via == "command":
            return health("--min-workers", "0")
        response = Client().get("/delayjobs/health/", {"min_workers": "0"})
        return response.status_code, response.json()

    os.kill(timeless_cache.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        done, found = within(10, check)
        took = time.monotonic() - started
    finally:
        os.kill(timeless_cache.pid, signal.SIGCONT)
    assert done, "the check hung on a frozen Redis"
    assert took < 5, took
    if via == "command":
        code, lines = found[0]
        assert code == 1 and names(lines, "ok") == ["database"], lines
        assert "no socket timeout" in lines[0] and "SOCKET_TIMEOUT" in lines[0], lines[0]
        assert names(lines, "FAIL") == ["redis", "workers:default", "overdue:default"]
    else:
        status, body = found[0]
        assert status == 503
        assert body["checks"] == {
            "redis": "fail",
            "database": "ok",
            "workers:default": "fail",
            "overdue:default": "fail",
        }


@pytest.mark.skipif("os.environ.get('DATABASE_URL') is None",
                    reason="psycopg's errors of several lines (PostgreSQL)")  # fmt: skip
def test_each_check_is_one_line_whatever_its_reason(tmp_path, caplog):
    """A reason of several lines (psycopg's "connection refused", then a tab and "Is the
    server running on that host...?") broke the command's one line per check: a line
    that is no check, which a probe or a script reading the output took for one (or for
    garbage). The view's log line was cut the same way. Each reason is one line now."""
    conn = connections["default"]
    with database_down(tmp_path):
        old, conn.settings_dict["PORT"] = conn.settings_dict["PORT"], "1"  # nothing listens
        try:
            code, lines = health("--min-workers", "0")
            Client().get("/delayjobs/health/", {"min_workers": "0"})
        finally:
            conn.settings_dict["PORT"] = old
    assert code == 1
    assert [line.split()[1] for line in lines] == [
        "redis", "database", "workers:default", "overdue:default"
    ], lines  # fmt: skip
    assert all(line.startswith(("ok   ", "FAIL ")) for line in lines), lines
    assert "Is the server running" in lines[1], lines[1]  # the second line of psycopg's
    logged = [r.getMessage() for r in caplog.records if r.name == "django_delayjobs.health"]
    assert logged and all("\n" not in m and "\t" not in m for m in logged), logged


@pytest.mark.skipif("os.environ.get('DATABASE_URL') is None",
                    reason="table privileges of a role (PostgreSQL)")  # fmt: skip
def test_a_database_role_that_may_not_update_the_job_table_fails():
    """A role that may read the job table but not update it (a read-only user, a
    reporting one given by mistake) answers both of the check's ``SELECT`` and is not in
    a read-only transaction, yet every claim fails with "permission denied": the check
    said ok. It asks whether the role may update the job table, in the same query."""
    from django_delayjobs.models import Job

    conn = connections["default"]
    role = f"hlt2_reader_{uuid.uuid4().hex[:8]}"
    table = conn.ops.quote_name(Job._meta.db_table)
    password = uuid.uuid4().hex  # a server that asks for one (not trust) gets it
    with conn.cursor() as cursor:
        # Written out (hex digits only): utility statements take no bound parameters under
        # server-side binding (CI's second PostgreSQL pass).
        cursor.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    old = conn.settings_dict["USER"], conn.settings_dict["PASSWORD"]
    try:
        with conn.cursor() as cursor:
            cursor.execute(f"GRANT SELECT ON {table} TO {role}")
        conn.close()
        conn.settings_dict["USER"], conn.settings_dict["PASSWORD"] = role, password
        code, lines = health("--min-workers", "0")
        response = Client().get("/delayjobs/health/", {"min_workers": "0"})
    finally:
        conn.close()
        conn.settings_dict["USER"], conn.settings_dict["PASSWORD"] = old
        with conn.cursor() as cursor:
            cursor.execute(f"REVOKE ALL ON {table} FROM {role}")
            cursor.execute(f"DROP ROLE IF EXISTS {role}")
    assert code == 1 and names(lines, "FAIL") == ["database"], lines
    assert f"this role ({role}) may not update the job table" in lines[1], lines[1]
    assert response.status_code == 503 and response.json()["checks"]["database"] == "fail"
    assert health("--min-workers", "0")[0] == 0


@pytest.mark.parametrize("option", ["--queues", "--max-overdue", "--min-workers", "--max-garbage"])
def test_an_option_given_twice_is_a_bad_option(option):
    """``--queues a --queues b`` checked b alone (argparse keeps the last), and a probe
    so written said healthy while queue a was never checked; the view refuses
    ``?queues=a&queues=b`` for that reason. Each option is taken once: exit 2."""
    with pytest.raises(CommandError) as failed:
        health(option, "1", option, "2")
    assert failed.value.returncode == 2
    assert f"{option} given 2 times: give it once" in str(failed.value)
    assert health("--min-workers", "0", "--queues", "default")[0] == 0  # once is fine
