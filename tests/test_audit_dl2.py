"""Audit of the health check's deadline: while a check given up on still waited, every
later probe failed at once (a load balancer's 4 s probe too, broken by anyone asking
``?timeout=1e-300``), concurrent probes did not share the check under way, and a check
given up on went on asking every master and shard. Real redis-servers of the tests' own,
stopped with SIGSTOP and woken with SIGCONT."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client, override_settings
from django.utils import timezone

from django_delayjobs import health, schedule_many
from django_delayjobs.connection import get_engine
from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.services import build_job
from tests.test_audit_cls3 import node, settings_for
from tests.test_audit_dl import SlowReplies
from tests.test_audit_hlt import frozen
from tests.test_health import health as command
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def health_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "delayjobs-health"]


@pytest.fixture(autouse=True)
def no_check_left() -> Iterator[None]:
    """Each test ends with the health checks it started (module state: test order must not
    matter); the tests wake their Redis first."""
    yield
    for thread in health_threads():
        thread.join(15)
    assert health_threads() == []


@pytest.fixture
def frozen_patient_redis(own_redis: EmbeddedRedis, settings: Any) -> EmbeddedRedis:
    """``own_redis``, stopped, as the jobs' Redis with a 10 s socket timeout: a call given up
    on waits until the test wakes it (SIGCONT), not for 1 s."""
    assert own_redis.pid is not None
    os.kill(own_redis.pid, signal.SIGSTOP)
    url = f"{own_redis.url}{'&' if '?' in own_redis.url else '?'}socket_timeout=10"
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": url}
    return own_redis


def wake(server: EmbeddedRedis) -> None:
    assert server.pid is not None
    os.kill(server.pid, signal.SIGCONT)


def probe(answers: list[Any], **query: str) -> threading.Thread:
    """A ``health/`` probe in a thread of its own; its status and body go in ``answers``."""

    def get() -> None:
        response = Client().get("/delayjobs/health/", {"min_workers": "0", **query})
        answers.append((response.status_code, response.json()))

    thread = threading.Thread(target=get)
    thread.start()
    return thread


def test_a_probe_waits_for_a_check_given_up_on_and_answers_when_redis_recovers(
    frozen_patient_redis,
):
    """A probe with a short timeout gives up on its check, which waits on the frozen Redis.
    A load balancer's probe made then failed at once; it now waits for that check to end
    (within its own timeout), then checks, and says healthy once Redis answers."""
    given_up = Client().get("/delayjobs/health/", {"timeout": "0.5", "min_workers": "0"})
    assert given_up.status_code == 503
    assert len(health_threads()) == 1  # given up on, still waiting on Redis
    answers: list[Any] = []
    lb = probe(answers, timeout="8")
    lb.join(0.5)
    assert lb.is_alive(), answers  # it waits, rather than fail at once
    wake(frozen_patient_redis)
    lb.join(10)
    ok = {"redis": "ok", "database": "ok", "workers:default": "ok", "overdue:default": "ok"}
    assert answers == [(200, {"status": "ok", "checks": ok})]


def test_concurrent_probes_against_a_frozen_redis_share_one_check(
    frozen_patient_redis, monkeypatch
):
    """Eight probes at once against a frozen Redis: one check runs, and each probe answers
    from it at its own deadline, naming what it waits on (not "an earlier check")."""
    started = []
    unbounded = health._unbounded_from_settings

    def counted(limits: health.Limits) -> list[health.Check]:
        started.append(limits)
        return unbounded(limits)

    monkeypatch.setattr(health, "_unbounded_from_settings", counted)
    answers: list[Any] = []
    limits = health.Limits(queues=("default",), min_workers=0, timeout=1)
    threads = [
        threading.Thread(target=lambda: answers.append(health.run_from_settings(limits)))
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    alive = len(health_threads())
    wake(frozen_patient_redis)
    assert len(started) == 1 and alive <= 1, (started, alive)
    assert len(answers) == 8
    for checks in answers:
        assert [c.ok for c in checks] == [False] * 4, checks
        assert checks[0].detail == (
            "not checked within the health check's 1 s, waiting on Redis (its INFO)"
        ), checks


def test_probes_of_other_limits_wait_for_the_check_under_way(frozen_patient_redis):
    """A probe of other queues does not share the check under way: it waits for it to end,
    then makes its own."""
    answers: list[Any] = []
    first = probe(answers, timeout="8")
    second = probe(answers, timeout="8", queues="other")
    second.join(0.5)
    assert second.is_alive() and first.is_alive()
    wake(frozen_patient_redis)
    first.join(10)
    second.join(10)
    assert sorted(status for status, _ in answers) == [200, 200], answers
    assert {name for _, body in answers for name in body["checks"]} >= {"workers:other"}


@pytest.mark.parametrize("value", ["1e-300", "0.3", "30.5", "600", "4s"])
def test_the_view_refuses_a_timeout_out_of_its_bounds(value):
    response = Client().get("/delayjobs/health/", {"timeout": value})
    assert response.status_code == 400, response.content
    assert "0.5" in response.json()["error"] or value == "4s", response.json()


@pytest.mark.parametrize("value", ["0.5", "30"])
def test_the_view_takes_a_timeout_within_its_bounds(value):
    """Taken (not a 400): a whole check within 0.5 s is not this test's to ask of a
    loaded machine."""
    response = Client().get("/delayjobs/health/", {"timeout": value, "min_workers": "0"})
    assert response.status_code in (200, 503), response.content
    assert "error" not in response.json(), response.json()


def test_the_command_takes_a_longer_timeout():
    code, lines = command("--timeout", "600", "--min-workers", "0")
    assert code == 0, lines


def test_a_check_given_up_on_stops_at_the_next_shard(own_redis, settings):
    """A queue of 16 shards, each with a ready job, on a Redis that answers each call 0.3 s
    late: the due time of each shard's oldest ready job is 2 calls and a query. Given up
    on while it reads them, the check stops before the next shard, not 16 shards later."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": own_redis.url,
                          "QUEUE_SHARDS": {"default": 16}}  # fmt: skip
    now = timezone.now()
    schedule_many(
        [build_job(tasks.record, at=now - timedelta(seconds=1), args=[str(n)]) for n in range(160)]
    )
    engine = get_engine()
    engine.promote("default")
    assert all(shard.ready for shard in engine.stats("default").shards), "a shard is empty"
    proxy = SlowReplies(str(own_redis.socket_path))
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": f"redis://127.0.0.1:{proxy.port}/0"}
    try:
        started = time.monotonic()
        get_engine().stats("default")  # a call per shard, each 0.3 s late
        reads = time.monotonic() - started
        # given up at the third shard: INFO and a write, its stats, two shards (2 calls each)
        timeout = f"{0.6 + reads + 1.2 + 0.3:.1f}"
        code, lines = command("--min-workers", "0", "--timeout", timeout)
        given_up = time.monotonic()
        assert code == 1, lines
        assert "oldest ready job" in lines[-1], lines  # given up in the loop over shards
        (thread,) = health_threads()
        thread.join(10)
        assert time.monotonic() - given_up < 1.5, lines  # one shard (0.6 s), not 15
    finally:
        proxy.close()


@pytest.mark.cluster
def test_a_check_given_up_on_asks_no_further_master(on_lonely):
    """A Cluster whose first master is frozen: the check, given up on while that master's
    INFO waits for its socket timeout, stops there: it went on to read every other
    master's INFO and ask each of them for a write."""
    cluster, client = on_lonely

    def writes(address: str) -> int:
        stats = client.info("commandstats", target_nodes=client.get_node(node_name=address))
        return int(stats.get("cmdstat_setrange", {}).get("calls", 0))

    with override_settings(DELAYJOBS=settings_for(cluster)):
        first, *others = [n.name for n in get_engine().client.get_primaries()]
        before = {address: writes(address) for address in others}
        with frozen(node(cluster, first)):
            code, lines = command("--min-workers", "0", "--timeout", "0.5")
            assert code == 1 and lines[0] == (
                "FAIL redis            not checked within the health check's 0.5 s, waiting "
                f"on Redis (master {first}: its INFO)"
            ), lines
            (thread,) = health_threads()
            thread.join(10)
            assert not thread.is_alive()
            assert {address: writes(address) for address in others} == before


def test_a_check_older_than_a_probes_timeout_is_not_shared(frozen_patient_redis):
    """Review: probes that kept coming (a prober every second) kept the check under way
    going for as long as they overlapped, answering with what it found minutes before. A
    probe now shares a check only if it started less than the probe's timeout ago; else it
    waits for that check to end, within its own timeout."""
    limits = health.Limits(queues=("default",), min_workers=0, timeout=8)
    first = threading.Thread(target=health.run_from_settings, args=(limits,))
    first.start()
    time.sleep(1.5)  # the check is now older than the next probe's timeout
    late = health.run_from_settings(replace(limits, timeout=1))
    wake(frozen_patient_redis)
    first.join(10)
    assert late[0].detail.startswith(
        "not checked in time: an earlier health check still waits on Redis"
    ), late
