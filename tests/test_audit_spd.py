"""Audit of the test suite's speed: what the faster fixtures must still guarantee."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.core.management import call_command

from django_delayjobs import schedule
from django_delayjobs.engine import Engine, close_client
from django_delayjobs.models import Job, Status
from tests.engine.conftest import Backend, flushed, on_cluster, open_backend
from tests.testapp import tasks


@pytest.fixture(params=["single", on_cluster("cluster")])
def backend(request: pytest.FixtureRequest) -> Backend:
    return open_backend(request, request.param)


def test_a_shared_client_that_a_test_closed_serves_the_next_test_flushed(backend: Backend) -> None:
    """The engine tests share one client per backend: one test's leftovers (keys, its
    engine closed, which on a Cluster drops the client's default node) reach no other."""
    client: Any = backend.client()
    try:
        engine = Engine(client, prefix="t")
        engine.add("q", {"a": 0})
        engine.close()
        engine = Engine(flushed(client, backend.cluster), prefix="t")
        assert engine.server_time_ms() > 0
        assert engine.known_queues() == []
        assert client.keys("*") == []
    finally:
        close_client(client)


@pytest.mark.django_db(transaction=True)
def test_a_burst_ends_as_soon_as_its_work_is_done() -> None:
    """A burst's main thread looked at its worker threads every 0.2 s: each run ended up
    to 0.2 s after its last job (it always waited once), which cron and every burst of
    the test suite paid: every burst took at least 0.2 s. Now each ends with its work, so
    the quickest of five (the one a busy machine slowed least) takes less."""
    took = []
    for n in range(5):
        schedule(tasks.record, in_=0, args=[str(n)])
        started = time.monotonic()
        call_command("run_delayworker", "--burst", "-v", "0")
        took.append(time.monotonic() - started)
    assert list(Job.objects.values_list("status", flat=True)) == [Status.SUCCEEDED] * 5
    assert min(took) < 0.2, f"bursts took {', '.join(f'{t:.3f}' for t in took)} s"
