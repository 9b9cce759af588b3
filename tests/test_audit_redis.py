"""Audit of the engine facing a Redis in hostile or unusual states (moved once fixed)."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_delayjobs.embedded import find_redis_server
from django_delayjobs.engine import Engine, EngineUnavailable, close_client

from .helpers import TcpProxy, wait_for


def _free_port() -> int:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = int(probe.getsockname()[1])
    probe.close()
    return port


@pytest.fixture
def two_redis(tmp_path: Path) -> Iterator[list[int]]:
    """Two redis-servers of this test's own on TCP ports, stopped by pid."""
    ports, processes = [], []
    try:
        for n in range(2):
            port = _free_port()
            processes.append(subprocess.Popen(
                [find_redis_server(), "--port", str(port), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--dir", str(tmp_path),
                 "--logfile", str(tmp_path / f"redis{n}.log")],
                stdin=subprocess.DEVNULL,
            ))  # fmt: skip
            client = redis.Redis(port=port)
            wait_for(lambda c=client: _answers(c))
            client.close()
            ports.append(port)
        yield ports
    finally:
        for process in processes:
            process.kill()
            process.wait(5)


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


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
