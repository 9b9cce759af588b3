"""Audit of the worker's metrics port against the Redis pool check.

``run_delayworker`` refuses a Redis pool smaller than the connections its threads may
hold at once, and counts one for ``--metrics-port``; but the port served up to
``MAX_CONNECTIONS`` scrapes at once, each reading Redis on a connection of its own. A pool
sized as the check asks then failed the worker's own calls with "Too many connections"
while scrapers came together. Scrapes now read one at a time.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from django_delayjobs import schedule
from django_delayjobs.metrics import server as metrics_server
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def scraped(url: str) -> int:
    """The status a scrape of ``url`` answered."""
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_scrapes_that_come_together_use_one_redis_connection(settings, redis_url, caplog):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": f"{redis_url}?max_connections=1"}
    schedule(tasks.record, in_=0, args=["ready"])  # a ready job: its row is read too
    srv = metrics_server.MetricsServer("127.0.0.1", 0).start()
    codes: list[int] = []

    def scrape() -> None:
        codes.append(scraped(f"http://127.0.0.1:{srv.port}/metrics"))

    try:
        for _ in range(5):  # rounds of scrapes at once: each round overlaps, unserialized
            threads = [
                threading.Thread(target=scrape) for _ in range(metrics_server.MAX_CONNECTIONS)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        srv.close()
    assert codes == [200] * 5 * metrics_server.MAX_CONNECTIONS, caplog.text[-500:]


def test_a_time_before_year_1_in_redis_is_shown_as_the_earliest(redis_client, settings):
    """A score another program wrote (or a clamped Lua reply) far below zero: Redis may hold
    any score, and ``ms_datetime`` guarded only the far future, so the stats command, the
    API's queues/ and the admin's queue page raised ValueError for the whole page."""
    from django.core.management import call_command

    from django_delayjobs.connection import get_engine
    from django_delayjobs.queues import EARLIEST, ms_datetime

    for ms in (-(10**20), -(2**63), -62_135_596_800_001):
        assert ms_datetime(ms) == EARLIEST
    engine = get_engine()
    redis_client.zadd(engine.keys("default").pending, {"x": -9.2e18})
    call_command("delayjobs_stats")  # raised ValueError: year -291... is out of range
    staff = Client()
    staff.force_login(User.objects.create_superuser("boss", "boss@example.com", "pw"))
    assert staff.get(reverse("admin:django_delayjobs_queues")).status_code == 200


@pytest.mark.slow
def test_scrapes_queued_behind_a_frozen_redis_each_answer_and_the_port_recovers(
    settings, own_redis, frozen_redis
):
    """While Redis does not answer, the scrape reading it holds the lock for its socket
    timeout; those queued behind it each answer 503 in turn (none waits for good on the
    lock), and once Redis answers again the next scrape reads it: 200."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": frozen_redis}
    srv = metrics_server.MetricsServer("127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{srv.port}/metrics"
    codes: list[int] = []

    def scrape() -> None:
        codes.append(scraped(url))

    try:
        began = time.monotonic()
        threads = [threading.Thread(target=scrape) for _ in range(metrics_server.MAX_CONNECTIONS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        took = time.monotonic() - began
        assert codes == [503] * metrics_server.MAX_CONNECTIONS
        assert took < 30, took  # in turn, a socket timeout or so each
        os.kill(own_redis.pid, signal.SIGCONT)
        deadline = time.monotonic() + 10
        while codes[-1] != 200 and time.monotonic() < deadline:
            scrape()  # the outage's back-off may refuse a scrape or two
        assert codes[-1] == 200
    finally:
        srv.close()
