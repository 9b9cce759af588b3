"""Audit of the worker's metrics port against the Redis pool check.

``run_delayworker`` refuses a Redis pool smaller than the connections its threads may
hold at once, and counts one for ``--metrics-port``; but the port served up to
``MAX_CONNECTIONS`` scrapes at once, each reading Redis on a connection of its own. A pool
sized as the check asks then failed the worker's own calls with "Too many connections"
while scrapers came together. Scrapes now read one at a time.
"""

from __future__ import annotations

import threading
import urllib.request

import pytest

from django_delayjobs import schedule
from django_delayjobs.metrics import server as metrics_server
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_scrapes_that_come_together_use_one_redis_connection(settings, redis_url, caplog):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": f"{redis_url}?max_connections=1"}
    schedule(tasks.record, in_=0, args=["ready"])  # a ready job: its row is read too
    srv = metrics_server.MetricsServer("127.0.0.1", 0).start()
    codes: list[int] = []

    def scrape() -> None:
        url = f"http://127.0.0.1:{srv.port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                codes.append(response.status)
        except urllib.error.HTTPError as exc:
            codes.append(exc.code)

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
