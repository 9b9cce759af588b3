"""The lead's audit, 2026-12-01 (afternoon): the worker process's id."""

import socket

import pytest

from django_delayjobs.connection import get_engine
from django_delayjobs.engine.validation import is_id
from django_delayjobs.worker import Options, WorkerProcess


@pytest.mark.django_db(transaction=True)
def test_a_long_host_name_still_gives_every_process_its_own_valid_id(monkeypatch, redis_url):
    """The id is the host's name, the pid and a random part. A host name may be longer
    than Linux's 64 characters (255 on macOS): the id then passed the 128 characters a
    heartbeat takes (every heartbeat raised), and a job row keeps only its first 128, so
    two processes on one host had the same id in the rows, where the same-process takeover
    reads it. The random part also had only 24 bits."""
    monkeypatch.setattr(socket, "gethostname", lambda: "h" * 255)
    ids = [WorkerProcess(get_engine(), Options(queues=["default"])).id for _ in range(2)]
    assert all(is_id(id_) and len(id_) <= 128 for id_ in ids)
    assert ids[0] != ids[1]
    random_part = ids[0].rsplit(":", 1)[1]
    assert len(random_part) >= 12  # 48 bits: no collision among the processes of a fleet
    process = WorkerProcess(get_engine(), Options(queues=["default"]))
    process.heartbeat(ttl_ms=10_000)
    assert get_engine().stats("default").live_workers == 1
    process.heartbeat(ttl_ms=0)
