"""A worker's database threads have a watchdog.

The reconcile sweep and the database housekeeping (the owner check, the pruning) talk to
the database in threads of their own. A connection left half-open (a failover or a
network cut that sends no reset) held one of them in a socket read for good, without
keepalives, while the process went on heartbeating: it looked healthy, and Redis was no
longer repaired, or the owner no longer checked. Such a thread now counts as dead once it
has made no progress for 30 ``HEARTBEAT_SECONDS`` past its own pause.
"""

from __future__ import annotations

import pytest
from django.db import connection

from django_delayjobs.connection import get_engine
from tests.helpers import start_worker, wait_for
from tests.test_audit_wrk import exit_code
from tests.test_worker_processes import DatabaseOutage

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("thread", "query", "args"),
    [
        ("delayjobs-reconcile", b"django_delayjobs_job", ()),
        # A worker-only process runs no sweep: its owner check is its only query.
        ("delayjobs-housekeeping-db", b"django_delayjobs_deployment", ("--worker-only",)),
    ],
)
def test_a_database_thread_stuck_on_a_silent_connection_stops_its_worker(
    thread, query, args, redis_url, tmp_path
):
    """Through a proxy that goes silent on the connection that sends the thread's query:
    the bound is 1 + 30 * 0.2 = 7 s for the sweep (it pauses RECONCILE_SECONDS), about
    6 s for the housekeeping."""
    if connection.vendor != "postgresql":
        pytest.skip("a connection left half-open (PostgreSQL through a proxy)")
    outage = DatabaseOutage()
    assert outage.proxy is not None
    env = {**outage.env, "DELAYJOBS_RECONCILE_SECONDS": "1",
           "DELAYJOBS_HEARTBEAT_SECONDS": "0.2"}  # fmt: skip
    log = tmp_path / "w.log"
    worker = start_worker(redis_url, *args, env=env, log=log)
    try:
        wait_for(lambda: get_engine().stats("default").live_workers)
        outage.proxy.silence(query)
        assert exit_code(worker, 60) == 1, log.read_text()
    finally:
        outage.proxy.down()
    text = log.read_text()
    assert f"thread {thread} has made no progress for" in text, text
    assert get_engine().stats("default").live_workers == 0  # its heartbeat went first
