"""Calls that reach no Redis of the engine tests' backends: bad input refused before any
command is sent, a Redis that does not exist, a master that became a replica.

In ``test_operations.py`` each would run once per backend, twice on the cluster for nothing
(their client points elsewhere): here they run once, on what they make themselves.
"""

from __future__ import annotations

import math
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_delayjobs.embedded import find_redis_server
from django_delayjobs.engine import Engine, EngineUnavailable, close_client

from ..helpers import TcpProxy, free_port, redis_answers, wait_for
from .test_operations import BAD_CALLS, Q


@pytest.fixture
def unreachable(tmp_path) -> Engine:
    """An engine whose Redis does not exist: any command sent raises EngineUnavailable."""
    client = redis.Redis(
        unix_socket_path=str(tmp_path / "nothing.sock"), retry=Retry(NoBackoff(), 0)
    )
    return Engine(client, prefix="t")


def test_an_unreachable_redis_raises_engine_unavailable(unreachable):
    with pytest.raises(EngineUnavailable):
        unreachable.add(Q, {"a": 0})
    with pytest.raises(EngineUnavailable):
        unreachable.stats(Q)
    with pytest.raises(EngineUnavailable):  # the promoter's listing each minute
        unreachable.list_shards(Q)
    with pytest.raises(EngineUnavailable):  # reconcile's, for running jobs Redis lost
        unreachable.adopt(Q, ["a"], 1000)


@pytest.fixture
def two_redis(tmp_path: Path) -> Iterator[list[int]]:
    """Two redis-servers of this test's own on TCP ports, stopped by pid."""
    ports, processes = [], []
    try:
        for n in range(2):
            port = free_port()
            processes.append(subprocess.Popen(
                [find_redis_server(), "--port", str(port), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--dir", str(tmp_path),
                 "--logfile", str(tmp_path / f"redis{n}.log")],
                stdin=subprocess.DEVNULL,
            ))  # fmt: skip
            client = redis.Redis(port=port)
            wait_for(lambda c=client: redis_answers(c))
            client.close()
            ports.append(port)
        yield ports
    finally:
        for process in processes:
            process.kill()
            process.wait(5)


def test_a_master_that_became_a_replica_is_left_for_the_new_one(two_redis):
    """A failover behind one address (a DNS name, a proxy): the old master becomes a
    replica and refuses every write with READONLY on the connections still open to it,
    while new connections reach the new master. The engine kept its pooled connections,
    so every worker refused forever, alive and doing nothing, until restarted."""
    old, new = two_redis
    proxy = TcpProxy("127.0.0.1", old)
    proxy.up()
    client = redis.Redis(port=proxy.port, socket_timeout=1, retry=Retry(NoBackoff(), 0))
    engine = Engine(client, prefix="t")
    try:
        engine.add("q", {"a": 0})
        proxy.target = ("127.0.0.1", new)  # new connections reach the new master
        redis.Redis(port=old).replicaof("127.0.0.1", new)  # the old one: a replica
        with pytest.raises(EngineUnavailable, match="READONLY"):
            engine.add("q", {"b": 0})
        assert engine.add("q", {"b": 0}) == ["b"]
        assert redis.Redis(port=new).smembers(engine.keys("q").ready_set) == {b"b"}
    finally:
        close_client(client)
        proxy.down()


@pytest.mark.parametrize(("call", "exc"), [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_bad_input_is_refused_before_any_command_is_sent(unreachable, call, exc):
    # Had a command been sent first, this would be EngineUnavailable, not exc.
    with pytest.raises(exc):
        call(unreachable)


@pytest.mark.parametrize("prefix", ["", "a:b", "{a}", "a b", 1, None, "x" * 65])
def test_a_bad_prefix_is_refused(unreachable, prefix):
    with pytest.raises((TypeError, ValueError)):
        Engine(unreachable.client, prefix=prefix)


@pytest.mark.parametrize("method", ["wait_for_wake", "wait_for_work"])
def test_waiting_on_a_single_string_instead_of_a_list_is_refused(unreachable, method):
    # A str is a sequence: "orders" would have waited on queues o, r, d, e, r, s.
    with pytest.raises(TypeError, match="list of queue names"):
        getattr(unreachable, method)("orders", 0.01)


@pytest.mark.parametrize("timeout", [math.nan, math.inf, -math.inf, -0.5], ids=str)
@pytest.mark.parametrize("method", ["wait_for_wake", "wait_for_work"])
def test_a_non_finite_or_negative_wait_timeout_is_refused(unreachable, method, timeout):
    with pytest.raises(ValueError, match="timeout"):
        getattr(unreachable, method)([Q], timeout)
