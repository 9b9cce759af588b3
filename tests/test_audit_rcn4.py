"""The reconcile sweep, fourth pass: the repair's requeue takes out of garbage only an id
buried before its row was read; a running row whose due time SQLite holds as a BLOB."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.db import connection

from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.engine import EngineUnavailable, PartlyUnavailable, close_client
from django_delayjobs.models import Job, Status
from django_delayjobs.reconcile import Reconciled, reconcile
from tests.conftest import cluster_client
from tests.helpers import age_rows
from tests.test_audit_rcn3 import dies_after_its_row_is_read, in_garbage_only
from tests.test_rest_helpers import redis_state
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_job_that_dies_after_the_sweep_read_it_never_leaves_garbage(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row was read waiting; its job then ran, died and was buried before its chunk was
    repaired. The repair's requeue took the id out of garbage, and a second call put it
    back: a Redis that filled up in between (``noeviction``) refused that call and kept the
    removal, and the dead job's id was in no Redis structure, for ever."""
    job = schedule(tasks.record, in_=60, args=["x"])
    age_rows()
    engine = get_engine()
    progress = dies_after_its_row_is_read(redis_client, job)
    revived: list[str] = []
    requeue = engine.requeue

    def requeue_then_fill(*args: Any, **kwargs: Any) -> list[str]:
        moved = requeue(*args, **kwargs)
        revived.extend(moved)
        redis_client.config_set("maxmemory", 1)  # Redis is full from now on
        return moved

    monkeypatch.setattr(engine, "requeue", requeue_then_fill)
    try:
        reconcile(engine, horizon=timedelta(minutes=5), progress=progress)
    except EngineUnavailable:  # the full Redis refused a write the sweep needed
        pass
    finally:
        redis_client.config_set("maxmemory", 0)
    assert revived == [] and in_garbage_only(redis_client, job)


def test_requeue_given_a_bound_takes_out_only_the_ids_buried_before_it(
    redis_client: redis.Redis,
) -> None:
    engine = get_engine()
    engine.add("default", {"a": 0, "b": 0})
    assert sorted(engine.claim("default", 2, 60_000)) == ["a", "b"]
    assert engine.bury("default", ["a"]) == 1
    time.sleep(0.005)
    between = engine.server_time_ms()
    time.sleep(0.005)
    assert engine.bury("default", ["b"]) == 1
    assert engine.requeue("default", ["a", "b"], buried_before=between) == ["a"]
    assert redis_client.zrange(engine.keys("default").garbage, 0, -1) == [b"b"]
    assert engine.requeue("default", ["b"]) == ["b"]  # no bound: any buried id


@pytest.mark.parametrize(
    ("bound", "error"),
    [("1", TypeError), (True, TypeError), (math.nan, ValueError), (math.inf, ValueError),
     (-1, ValueError), (10**400, ValueError)],
)  # fmt: skip
def test_a_requeue_bound_that_is_no_time_is_refused_before_any_move(
    redis_client: redis.Redis, bound: object, error: type[Exception]
) -> None:
    """A bound that is not a finite, non-negative number of ms is refused as every other
    time the engine takes is (``int()`` of it raised OverflowError, or took "1" and True),
    and nothing leaves garbage."""
    engine = get_engine()
    engine.add("default", {"a": 0})
    assert engine.claim("default", 1, 60_000) == ["a"]
    assert engine.bury("default", ["a"]) == 1
    with pytest.raises(error, match="buried_before"):
        engine.requeue("default", ["a"], buried_before=bound)  # type: ignore[arg-type]
    assert redis_client.zrange(engine.keys("default").garbage, 0, -1) == [b"a"]


def swept_with_due_time(redis_client: redis.Redis, job: Job, sql: str) -> tuple[Any, Any]:
    """Write ``job``'s due time as the SQLite literal ``sql`` (raw SQL, as a program of
    yours might), empty Redis and run a full sweep: the engine and the sweep's result."""
    table = connection.ops.quote_name(Job._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET run_at = {sql} WHERE id = %s", [job.pk.hex])
    redis_client.flushdb()
    engine = get_engine()
    return engine, reconcile(engine, horizon=None)


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite keeps a BLOB in any column")
@pytest.mark.parametrize("value", ["X'01'", "X'FF'"])
def test_a_running_job_whose_due_time_is_a_blob_is_still_put_back_in_flight(
    redis_client: redis.Redis, value: str
) -> None:
    """A running row whose id Redis lost was left out (``skipped``) when its due time was a
    BLOB, or not UTF-8, and stayed running for ever: its due time is not used."""
    job = schedule(tasks.record, in_=60, args=["x"])
    Job.objects.filter(pk=job.pk).update(status=Status.RUNNING)
    age_rows()
    engine, result = swept_with_due_time(redis_client, job, value)
    assert not result.skipped and not result.unusable
    assert result["default"] == 1
    assert redis_client.zscore(engine.keys("default").unack, str(job.pk)) is not None


def test_ids_taken_out_of_garbage_before_a_shard_failed_are_reported(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A purge that reached some shards only (a Cluster master down: ``PartlyUnavailable``)
    took ids out of garbage there; they were left out of ``cleared``. The purge is the real
    one, its shard failure stood in for: a Cluster's is slow to stage."""
    job = schedule(tasks.record, in_=0, args=["x"])
    engine = get_engine()
    assert engine.claim("default", 1, 60_000) == [str(job.pk)]
    assert engine.bury("default", [str(job.pk)]) == 1
    Job.objects.filter(pk=job.pk).update(status=Status.SUCCEEDED)
    purge = engine.purge

    def purge_then_fail(*args: Any, **kwargs: Any) -> int:
        raise PartlyUnavailable("a master is down", purge(*args, **kwargs))

    monkeypatch.setattr(engine, "purge", purge_then_fail)
    result = Reconciled()
    with pytest.raises(EngineUnavailable):
        reconcile(engine, horizon=None, into=result)
    assert result.cleared == {"default": 1}
    assert redis_client.zcard(engine.keys("default").garbage) == 0


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite keeps a number in any column")
def test_an_eight_digit_integer_due_time_reads_as_a_date(redis_client: redis.Redis) -> None:
    """docs/worker.md said a due time SQLite holds as a number is handed to a worker due
    now: one of 8 digits reads as an ISO date, and is due then."""
    job = schedule(tasks.record, in_=60, args=["x"])
    age_rows()
    engine, result = swept_with_due_time(redis_client, job, "20991231")
    assert result == {"default": 1} and not result.unusable
    due = redis_client.zscore(engine.keys("default").pending, str(job.pk))
    assert due == datetime(2099, 12, 31, tzinfo=UTC).timestamp() * 1000


@pytest.fixture
def on_cluster(redis_cluster: Any, settings: Any) -> Iterator[Any]:
    """The Django layer on the test cluster, with the queue ``orders`` in 6 shards."""
    redis_cluster.wait_healthy()
    client = cluster_client(redis_cluster.url)
    client.flushall()
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": redis_cluster.url,
                          "REDIS_CLUSTER": True, "QUEUE_SHARDS": {"orders": 6}}  # fmt: skip
    yield client
    close_client(client)


@pytest.mark.cluster
def test_on_a_cluster_the_sweep_requeues_the_ids_buried_before_it_read_their_rows(
    on_cluster: Any,
) -> None:
    """On a Cluster the bound is the process's clock (each shard buries by its own)."""
    dead = [schedule(tasks.fail, in_=0, args=[str(n)], max_attempts=1, queue="orders")
            for n in range(8)]  # fmt: skip
    call_command("run_delayworker", "--burst", "--queues", "orders", "-v", "0")
    assert {Job.objects.get(pk=j.pk).status for j in dead} == {Status.DEAD}
    lost = [str(j.pk) for j in dead[:4]]  # requeued, their Redis step lost
    Job.objects.filter(pk__in=lost).update(status=Status.SCHEDULED)
    age_rows()
    time.sleep(0.005)
    assert reconcile(get_engine(), horizon=None) == {"orders": 4}
    assert [redis_state(j) for j in dead] == ["ready"] * 4 + ["garbage"] * 4
