"""Audit of the embedded Redis, the embedded Cluster and the example shop."""

from __future__ import annotations

import os
import tempfile
import time

import pytest
import redis

from django_delayjobs.embedded import EmbeddedRedis


def served_by(url: str) -> int:
    with redis.Redis.from_url(url) as client:
        return int(client.info("server")["process_id"])


# -- EmbeddedRedis -------------------------------------------------------------------------


def test_an_embedded_redis_refuses_a_socket_path_too_long_for_a_unix_socket(tmp_path):
    """A directory whose socket path is longer than a unix socket's 107 bytes: redis-server
    cut the path short and bound its socket *outside* the directory (a file named after a
    prefix of the directory, left behind in the parent), ``start()`` waited its whole
    timeout (10 s) for the real path, then failed with a log that said nothing."""
    parent = tmp_path / "p"
    parent.mkdir()
    directory = parent / ("d" * (108 - len(str(parent))))
    assert len(str(directory / "redis.sock")) > 107
    started = time.monotonic()
    with pytest.raises(ValueError, match="too long for a unix socket"):
        EmbeddedRedis(directory).start(timeout=5)
    assert time.monotonic() - started < 1
    assert os.listdir(parent) == []  # no stray socket, no directory made


def test_an_embedded_redis_in_a_temporary_directory_too_long_leaves_nothing(tmp_path, monkeypatch):
    deep = tmp_path / ("t" * 100)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))  # a long TMPDIR
    with pytest.raises(ValueError, match="shorter"):
        EmbeddedRedis()
    assert os.listdir(deep) == []
