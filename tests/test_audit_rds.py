"""Unusual Redis states and failures: a key of the wrong type on one queue, a prune turn
without expiry, rows another model protects, counters of a forgotten shard."""

from __future__ import annotations

import io
import logging
import re
import threading
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.engine import EngineUnavailable
from django_delayjobs.models import Job, Status
from django_delayjobs.retention import AutoPrune
from django_delayjobs.worker import Options, WorkerProcess
from tests.testapp import tasks

from .helpers import wait_for
from .test_rest_helpers import client_for, make_user, url

FAR = 4_000_000_000_000  # ms: year 2096


# -- 1. a key of the wrong type on one queue ------------------------------------------------


def _claim(engine, client):
    engine.add("q", {"a": 0})
    keys = engine.keys("q")
    client.delete(keys.ready_set)
    client.set(keys.ready_set, "x")
    return keys.ready_set, lambda: engine.claim("q"), lambda: client.lrange(keys.ready, 0, -1)


def _promote(engine, client):
    keys = engine.keys("q")
    client.zadd(keys.pending, {"a": 1})
    client.set(keys.ready, "x")
    return keys.ready, lambda: engine.promote("q"), lambda: client.zrange(keys.pending, 0, -1)


def _recover(engine, client):
    keys = engine.keys("q")
    client.zadd(keys.unack, {"a": 1})
    client.set(keys.ready, "x")
    return keys.ready, lambda: engine.recover_expired("q"), lambda: client.zrange(keys.unack, 0, -1)


def _bury(engine, client):
    keys = engine.keys("q")
    client.zadd(keys.unack, {"a": FAR})
    client.set(keys.garbage, "x")
    return keys.garbage, lambda: engine.bury("q", ["a"]), lambda: client.zrange(keys.unack, 0, -1)


def _requeue(engine, client):
    keys = engine.keys("q")
    client.zadd(keys.garbage, {"a": 1})
    client.set(keys.ready, "x")
    return (
        keys.ready,
        lambda: engine.requeue("q", ["a"]),
        lambda: client.zrange(keys.garbage, 0, -1),
    )


def _add(engine, client):
    keys = engine.keys("q")
    client.set(keys.ready, "x")
    return (
        keys.ready,
        lambda: engine.add("q", {"later": FAR, "now": 0}),
        lambda: client.zrange(keys.pending, 0, -1),
    )


@pytest.mark.parametrize("case", [_claim, _promote, _recover, _bury, _requeue, _add],
                         ids=lambda c: c.__name__[1:])  # fmt: skip
def test_a_key_of_the_wrong_type_stops_a_script_before_it_writes_and_is_named(
    engine, redis_client, case
):
    """Redis does not roll a script back: claim popped ids from ready before SREM met a
    ready_set of the wrong type, and the ids were lost; promote, recover, bury, requeue
    and add likewise. The error did not say which key."""
    key, call, state = case(engine, redis_client)
    before = state()
    with pytest.raises(EngineUnavailable) as info:
        call()
    assert state() == before, "the script wrote before it failed"
    assert key in str(info.value) and "string" in str(info.value), str(info.value)


@pytest.mark.parametrize("name", ["ready", "notify"])
@pytest.mark.django_db(transaction=True)
def test_a_wrong_type_on_one_queue_slows_no_other_and_is_logged_once_by_name(
    redis_client, caplog, name
):
    """The worker backed off up to 5 s for every queue and logged "Redis is unavailable"
    (a notify list of the wrong type failed the wait on every queue's lists at once)."""
    engine = get_engine()
    broken = getattr(engine.keys("bad"), name)
    redis_client.set(broken, "x")
    process = WorkerProcess(engine, Options(queues=["bad", "good"], tick=0.1))
    thread = threading.Thread(target=process.run, daemon=True)
    caplog.set_level(logging.INFO, logger="django_delayjobs")
    thread.start()
    try:
        first = schedule(tasks.record, in_=0, args=["first"], queue="good")
        wait_for(lambda: Job.objects.get(pk=first.pk).status == Status.SUCCEEDED)
        time.sleep(1.5)  # idle beside the broken queue: a backoff would have grown by now
        started = time.monotonic()
        second = schedule(tasks.record, in_=0, args=["second"], queue="good")
        wait_for(lambda: Job.objects.get(pk=second.pk).status == Status.SUCCEEDED)
        assert time.monotonic() - started < 1.0
    finally:
        process.stop()
        thread.join(20)
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "unavailable" in m], messages
    named = [m for m in messages if broken in m]
    assert len(named) == 1 and "string" in named[0], messages
    assert [m for m in messages if "WRONGTYPE" in m] == named, messages


@pytest.mark.django_db(transaction=True)
def test_the_queue_pages_show_the_healthy_queues_and_name_the_broken_key(
    redis_client, admin_client
):
    """One error for every queue ("Redis refused the command") on the admin page and a
    503 from the API, when one key of one queue had the wrong type."""
    schedule(tasks.record, in_=60, args=["a"], queue="good")
    schedule(tasks.record, in_=60, args=["b"], queue="bad")
    broken = get_engine().keys("bad").pending
    redis_client.delete(broken)
    redis_client.sadd(broken, "x")
    api = client_for(make_user("api-root", superuser=True))
    response = api.get(url("queues"))
    assert response.status_code == 200, response.content[:300]
    queues = {q["queue"]: q for q in response.json()["queues"]}
    assert queues["good"]["pending"] == 1
    assert "bad" not in queues
    [error] = response.json()["broken_queues"]
    assert error["queue"] == "bad" and broken in error["error"] and "set" in error["error"]
    page = admin_client.get(reverse("admin:django_delayjobs_queues")).content.decode()
    assert 'data-queue="good"' in page
    assert broken in page
    charts = admin_client.get(reverse("admin:django_delayjobs_queues"), {"charts": "1h"})
    assert 'data-queue="good"' in charts.content.decode()


@pytest.mark.django_db(transaction=True)
def test_metrics_and_delayjobs_stats_show_the_other_queues_beside_a_broken_one(
    redis_client, client, settings
):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "METRICS_TOKEN": "t" * 32}
    schedule(tasks.record, in_=60, args=["a"], queue="good")
    schedule(tasks.record, in_=60, args=["b"], queue="bad")
    broken = get_engine().keys("bad").garbage
    redis_client.set(broken, "x")
    response = client.get(reverse("delayjobs_metrics"), HTTP_AUTHORIZATION="Bearer " + "t" * 32)
    assert response.status_code == 200, response.content[:300]
    assert 'queue="good"' in response.content.decode()
    out = io.StringIO()
    with pytest.raises(CommandError, match=re.escape(broken)):
        call_command("delayjobs_stats", stdout=out)
    assert "good" in out.getvalue()


# -- 2. a prune turn key without expiry -----------------------------------------------------


def old_finished_job(status: str = Status.SUCCEEDED) -> Job:
    now = timezone.now()
    return Job.objects.create(
        queue="default", action="tests.nothing", run_at=now - timedelta(days=100),
        status=status, finished_at=now - timedelta(days=40),
    )  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_a_prune_turn_key_without_expiry_holds_automatic_pruning_for_one_interval_only(
    redis_client, settings
):
    """Another program's SET of the turn key (no PX) was a turn that never ended: no
    worker ever pruned again, and nothing said so."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "PRUNE_AFTER_SECONDS": 86400}
    engine = get_engine()
    old = old_finished_job()
    key = f"{{{engine.prefix}}}:turn:prune"
    redis_client.set(key, "1")
    pruner = AutoPrune(engine, every=0.2)

    def pruned() -> bool:
        pruner.step()
        return not Job.objects.filter(pk=old.pk).exists()

    wait_for(pruned, timeout=5)
    assert 0 < redis_client.pttl(key) <= 200


# -- 3. rows another table refers to ---------------------------------------------------------


@pytest.fixture
def note_table(transactional_db):
    """A table of the user's with a real foreign key to the job table (no Django model:
    a constraint the database enforces, as a model's PROTECT or a hand-made table's)."""
    key = "uuid" if connection.vendor == "postgresql" else "char(32)"
    job_table = Job._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE audit_rds_note (id integer PRIMARY KEY, job_id {key} NOT NULL "
            f"REFERENCES {job_table} (id))"
        )
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE audit_rds_note")


def refer_to(job: Job) -> None:
    value = Job._meta.pk.get_db_prep_value(job.pk, connection)
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO audit_rds_note (id, job_id) VALUES (1, %s)", [value])


def test_prune_skips_the_rows_another_table_refers_to_and_says_so_once(note_table, caplog):
    """Every batch failed with the database's IntegrityError, reported by the command as
    "the database is unavailable"; the automatic prune retried for ever and pruned
    nothing."""
    now = timezone.now()
    protected = old_finished_job()
    Job.objects.filter(pk=protected.pk).update(finished_at=now - timedelta(days=50))  # first
    refer_to(protected)
    others = [old_finished_job() for _ in range(3)]
    caplog.set_level(logging.WARNING, logger="django_delayjobs")
    out = io.StringIO()
    call_command("delayjobs_prune", "--older-than", "30d", "--batch", "2", stdout=out)
    assert not Job.objects.filter(pk__in=[j.pk for j in others]).exists()
    assert Job.objects.filter(pk=protected.pk).exists()
    assert "left 1 job(s) that another table refers to" in out.getvalue()
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "unavailable" in m], messages
    [warning] = [m for m in messages if "refer" in m]
    assert "1 job" in warning, warning
    more = [old_finished_job() for _ in range(2)]
    with override_settings(DELAYJOBS={**settings.DELAYJOBS, "PRUNE_AFTER_SECONDS": 86400}):
        done = AutoPrune(get_engine(), batch=2).step()
    assert done is not None and done.jobs == 2, done
    assert not Job.objects.filter(pk__in=[j.pk for j in more]).exists()
    assert "automatic pruning failed" not in caplog.text


@pytest.fixture
def fail_second_delete_of(transactional_db):
    """``fail(job)``: from the second time the database is asked to delete that job's
    row, it fails as an outage does (OperationalError), by a trigger: the first ask is
    the batch's, which the row another table refers to rolls back whole."""
    table = Job._meta.db_table
    created = []

    def fail(job: Job) -> None:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("CREATE SEQUENCE audit_rds_asks")  # not rolled back
                cursor.execute(
                    "CREATE FUNCTION audit_rds_fail() RETURNS trigger LANGUAGE plpgsql AS $$"
                    f" BEGIN IF OLD.id = '{job.pk}' AND nextval('audit_rds_asks') >= 2 THEN"
                    " RAISE EXCEPTION 'the server went away' USING ERRCODE = '08006';"
                    " END IF; RETURN OLD; END $$"
                )
                cursor.execute(f"CREATE TRIGGER audit_rds_fail BEFORE DELETE ON {table} "
                               "FOR EACH ROW EXECUTE FUNCTION audit_rds_fail()")  # fmt: skip
            else:
                asks = []

                def check(value: str) -> int:
                    if value == job.pk.hex:
                        asks.append(value)
                        if len(asks) >= 2:
                            raise RuntimeError("the server went away")
                    return 0

                connection.connection.create_function("audit_rds_fail", 1, check)
                cursor.execute(f"CREATE TRIGGER audit_rds_fail BEFORE DELETE ON {table} "
                               "WHEN audit_rds_fail(old.id) BEGIN SELECT 1; END")  # fmt: skip
        created.append(job)

    yield fail
    if created:
        with connection.cursor() as cursor:
            cursor.execute(
                "DROP TRIGGER audit_rds_fail"
                + (f" ON {table}" if connection.vendor == "postgresql" else "")
            )
            if connection.vendor == "postgresql":
                cursor.execute("DROP FUNCTION audit_rds_fail()")
                cursor.execute("DROP SEQUENCE audit_rds_asks")


def test_a_database_failure_while_pruning_one_by_one_still_purges_the_ids_already_deleted(
    note_table, fail_second_delete_of
):
    """The rows deleted one by one before the failure are gone: their dead ids left
    Redis's garbage only with the batch's end, which the failure never reached, so the
    health check and the metrics counted them for ever."""
    from .test_retention import dead_in_garbage

    protected = old_finished_job(Status.DEAD)
    Job.objects.filter(pk=protected.pk).update(finished_at=timezone.now() - timedelta(days=50))
    refer_to(protected)
    _first, second = dead_in_garbage("default", 2)
    Job.objects.filter(pk=second.pk).update(finished_at=timezone.now() - timedelta(days=35))
    fail_second_delete_of(second)
    engine = get_engine()
    assert engine.stats("default").garbage == 2
    with pytest.raises(CommandError, match="the jobs database 'default' is unavailable"):
        call_command("delayjobs_prune", "--older-than", "30d", "--status", "dead",
                     "--batch", "3", stdout=io.StringIO())  # fmt: skip
    assert set(Job.objects.values_list("pk", flat=True)) == {protected.pk, second.pk}
    assert [i for i, _ in engine.garbage("default", 10)] == [str(second.pk)]
