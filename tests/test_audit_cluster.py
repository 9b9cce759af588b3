"""Audit of the Redis Cluster area: failing tests first (moved to their module once fixed)."""

from __future__ import annotations

import logging

import pytest

from django_delayjobs import schedule, services
from django_delayjobs.connection import get_engine
from django_delayjobs.outcomes import Outage
from tests.test_cluster_failover import SHARDS, engine, lonely_cluster, master_of  # noqa: F401
from tests.testapp import tasks

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


@pytest.mark.django_db(transaction=True)
def test_while_a_master_is_down_schedule_logs_the_outage_once(
    lonely_cluster,  # noqa: F811
    engine,  # noqa: F811
    settings,
    caplog,
    monkeypatch,
):
    """The adds of ``schedule()`` to the shards of a dead master fail, those to the others
    succeed, one after the other: that is one outage, logged once, not a warning (and a
    "back" line) for every job whose shard is on the dead master."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": lonely_cluster.url,
                          "REDIS_CLUSTER": True, "QUEUE_SHARDS": SHARDS}  # fmt: skip
    monkeypatch.setattr(services, "_outage", Outage("django_delayjobs", "reconcile will"))
    assert get_engine().shards("q")  # the process's engine has read the slot table
    lonely_cluster.kill(master_of(lonely_cluster, engine, engine.shards("q")[0]))
    with caplog.at_level(logging.WARNING):
        for n in range(30):
            schedule(tasks.record, in_=3600, args=[str(n)], queue="q")
    lines = [r.getMessage() for r in caplog.records]
    assert sum("Redis is unavailable" in line for line in lines) == 1, lines
    assert not any("Redis is back" in line for line in lines), lines
