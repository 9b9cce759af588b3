"""Audit (small): what a Redis Cluster with one master frozen leaves out (``pytest -m
cluster``): the old shards the promoter forgot in a call that passed over another."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import pytest
from django.test import override_settings

from django_delayjobs import promoter
from django_delayjobs.connection import get_engine
from django_delayjobs.engine import Engine
from django_delayjobs.worker import Options, WorkerProcess
from tests.test_audit_brk import SKIP
from tests.test_audit_cls3 import PREFIX, node, settings_for
from tests.test_audit_hlt import frozen

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]


def homed(engine: Engine, queue: str, shard: str) -> str:
    """A job id whose home in ``engine``'s count of ``queue`` is ``shard``."""
    return next(
        i for i in (str(uuid.uuid4()) for _ in range(1000)) if engine.home(queue, i) == shard
    )


def old_shards_apart(client: Any) -> tuple[str, str, str]:
    """A queue and its two shards of 2 (one to empty, one whose master freezes): the
    master of the second holds neither the directory of queues nor the shard of 1, into
    which the first one's counters are folded as it is forgotten, nor the first one."""
    directory = client.get_node_from_key(f"{{{PREFIX}}}:queues").name
    for n in range(1000):
        queue = f"forget{n}"
        engine = Engine(client, prefix=PREFIX, shards={queue: 2})
        first, second = f"{queue}#0/2", f"{queue}#1/2"
        for empty, stuck in ((first, second), (second, first)):
            master = engine.node_of(stuck)
            if master not in (directory, engine.node_of(f"{queue}#0/1"), engine.node_of(empty)):
                return queue, empty, stuck
    raise AssertionError("no such queue")


def test_the_old_shards_forgotten_beside_a_frozen_one_are_logged(on_lonely, monkeypatch, caplog):
    """A queue split in 2 then back to 1: one old shard is emptied (its job run and
    acked), the master of the other freezes. The promoter's look for empty old shards
    forgets the first and passes over the second (``PartlyUnavailable``): the shard it
    forgot is logged as it is when every master answers."""
    monkeypatch.setattr(promoter, "SKIP_SECONDS", SKIP)
    cluster, client = on_lonely
    queue, empty, stuck = old_shards_apart(client)
    split = Engine(client, prefix=PREFIX, shards={queue: 2})
    done = homed(split, queue, empty)
    split.add(queue, {done: 0})  # run and acked there: empty, and listed
    split.promote(empty)
    assert split.claim(empty, 1) == [done]
    split.ack(empty, [done])
    split.add(queue, {homed(split, queue, stuck): 0})  # not empty
    with override_settings(DELAYJOBS=settings_for(cluster)):
        engine = get_engine()
        assert {empty, stuck} <= set(engine.shards(queue))
        process = WorkerProcess(engine, Options(queues=[queue]))
        caplog.set_level(logging.INFO, logger="django_delayjobs")
        with frozen(node(cluster, engine.node_of(stuck))):
            process.promoter.housekeeping(time.monotonic(), process.promoter.new_pass())
        forgotten = [r.getMessage() for r in caplog.records if "no longer served" in r.getMessage()]
        assert forgotten == [f"queue {queue}: shard {empty} of an older shard count is empty; "
                             "no longer served"]  # fmt: skip
        assert empty not in engine.shards(queue) and stuck in engine.shards(queue)
