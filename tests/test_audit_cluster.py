"""Audit of the Redis Cluster area: failing tests first (moved to their module once fixed)."""

from __future__ import annotations

import pytest

from django_delayjobs.connection import get_engine
from django_delayjobs.metrics import snapshot
from django_delayjobs.promoter import Promoter
from django_delayjobs.services import build_job, schedule_many
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_queue_the_directory_lost_is_listed_again_by_a_promoter(settings):
    """On a Cluster the directory of queues lives on one master: if that one loses its data
    and the masters of a queue's shards do not, an add lists a shard again only once it
    finds it empty, so the queue, ids and all, was missing from the metrics and from
    ``delayjobs_stats`` until it had emptied. A promoter lists its queues' shards again."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "QUEUE_SHARDS": {"orders": 3}}
    schedule_many([build_job(tasks.record, in_=3600, args=[str(n)], queue="orders")
                   for n in range(30)])  # fmt: skip
    engine = get_engine()
    engine.client.delete(engine.queues_key)  # lost with its master's data
    assert "orders" not in snapshot.queue_names(engine)

    Promoter(engine, ["orders"]).step()
    assert "orders" in snapshot.queue_names(engine)
    assert sum(r.stats.pending for r in snapshot.read(engine) if r.name == "orders") == 30
