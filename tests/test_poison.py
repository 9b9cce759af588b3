"""Poison tolerance: a row that got into the table without passing the door (an older
version, a manual edit, a bug) never stops anything else. Reconcile repairs every other
job and hands it to a worker due now, with one log line and a count; the worker runs it
or settles it dead; the admin and the API render it (issue 13, findings 1-4). The rows
are planted with raw SQL, as such rows would arrive."""

from __future__ import annotations

import datetime
import logging
import threading
import uuid
from collections.abc import Callable
from io import StringIO

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.http import HttpResponse
from django.urls import reverse
from django.utils import timezone

from django_delayjobs import schedule
from django_delayjobs.admin import operations
from django_delayjobs.connection import get_engine
from django_delayjobs.engine.validation import MAX_DUE_MS
from django_delayjobs.models import Job, JobEvent, Status
from django_delayjobs.reconcile import horizon, reconcile
from django_delayjobs.rows import tolerant
from django_delayjobs.worker import Options, WorkerProcess
from tests.testapp import tasks
from tests.testapp.models import Record

from .helpers import age_rows, start_worker, stop, wait_for
from .test_rest_helpers import burst, client_for, make_user, url

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "admin:django_delayjobs_job_changelist"
CHANGE = "admin:django_delayjobs_job_change"
QUEUES = "admin:django_delayjobs_queues"


def sqlite() -> bool:
    return connection.vendor == "sqlite"


def moment(text: str) -> str:
    """A timestamp literal as each database stores ``DateTimeField`` values (UTC)."""
    return f"'{text}'" if sqlite() else f"'{text}+00'"


def nested_json(depth: int) -> str:
    return "'" + "[" * depth + "]" * depth + "'"


#: name -> (the database it can be planted in, or None for both; column -> SQL literal)
POISON: dict[str, tuple[str | None, Callable[[], dict[str, str]]]] = {
    "run_at 1969": (None, lambda: {"run_at": moment("1969-07-20 20:17:40")}),
    "run_at 1900": (None, lambda: {"run_at": moment("1900-01-01 00:00:00")}),
    "run_at 9999": (None, lambda: {"run_at": moment("9999-12-31 23:59:59.999999")}),
    "run_at year 1": (None, lambda: {"run_at": moment("0001-01-01 00:00:00")}),
    "run_at infinity": ("postgresql", lambda: {"run_at": "'infinity'"}),
    "run_at -infinity": ("postgresql", lambda: {"run_at": "'-infinity'"}),
    "run_at year 10000": ("postgresql", lambda: {"run_at": "'10000-01-01 00:00:00+00'"}),
    "run_at BC": ("postgresql", lambda: {"run_at": "'0044-03-15 00:00:00+00 BC'"}),
    "expires_at infinity": ("postgresql", lambda: {"expires_at": "'infinity'"}),
    "created_at year 20000": ("postgresql", lambda: {"created_at": "'20000-01-01 00:00:00+00'"}),
    "run_at not a date": ("sqlite", lambda: {"run_at": "'not a date'"}),
    "run_at 30 February": ("sqlite", lambda: {"run_at": "'2026-02-30 10:00:00'"}),
    "args lone surrogate": ("sqlite", lambda: {"args": '\'["\\ud800", "x\\udfff"]\''}),
    "kwargs lone surrogate key": ("sqlite", lambda: {"kwargs": "'{\"\\udc00\": 1}'"}),
    # beyond what Python's json parser recurses to (SQLite's JSON_VALID takes 2,000)
    "args nested 1500 deep": (None, lambda: {"args": nested_json(1500)}),
    "result nested 1500 deep": (None, lambda: {"result": nested_json(1500)}),
    # within it, but deeper than rendering (json.dumps) and the worker recurse safely
    "kwargs nested 900 deep": (None, lambda: {"kwargs": '\'{"a": ' + "[" * 900 + "]" * 900 + "}'"}),
    "kwargs 5000-digit int": (None, lambda: {"kwargs": '\'{"n": ' + "9" * 5000 + "}'"}),
    "attempts absurd": (None, lambda: {"attempts": "2147483647", "max_attempts": "2147483647"}),
    "attempts beyond 64 bits": ("sqlite", lambda: {"attempts": "9223372036854775807"}),
}
#: The poisons that concern reconcile: an unusable due time.
DUE_TIME_POISON = [
    "run_at 1969", "run_at 1900", "run_at year 1", "run_at infinity", "run_at -infinity",
    "run_at year 10000", "run_at BC", "run_at not a date", "run_at 30 February",
]  # fmt: skip


def plant(job: Job, name: str) -> None:
    """Write the named poison into ``job``'s row with raw SQL, past every check."""
    vendor, columns = POISON[name]
    if vendor is not None and vendor != connection.vendor:
        pytest.skip(f"{name!r} cannot be stored in {connection.vendor}")
    quote = connection.ops.quote_name
    sets = ", ".join(
        f"{quote(Job._meta.get_field(field).column)} = {literal}"
        for field, literal in columns().items()
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {quote(Job._meta.db_table)} SET {sets} WHERE {quote('id')} = %s",
            [Job._meta.pk.get_db_prep_value(job.pk, connection)],
        )
        assert cursor.rowcount == 1


def poisoned(name: str, **options: object) -> Job:
    job = schedule(tasks.record, in_=0, args=["poison"], **options)
    plant(job, name)
    return job


# -- reconcile ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", DUE_TIME_POISON)
def test_reconcile_repairs_all_others_and_hands_a_poison_row_to_a_worker(name, redis_client,
                                                                         caplog):  # fmt: skip
    bad = poisoned(name)
    good = [schedule(tasks.record, in_=0, args=[f"good-{i}"]) for i in range(5)]
    age_rows()
    redis_client.flushall()
    with caplog.at_level(logging.WARNING, logger="django_delayjobs.reconcile"):
        repaired = reconcile(get_engine(), horizon=horizon())  # the worker's sweep
        full = reconcile(get_engine(), horizon=None)  # delayjobs_reconcile: everything
    assert repaired["default"] + full["default"] == 6  # the five, and the poison row
    assert list(full.unusable) == [str(bad.pk)]
    lines = [r.getMessage() for r in caplog.records if "cannot be used" in r.getMessage()]
    assert len(lines) == len([r for r in (repaired, full) if r.unusable])  # one per sweep
    assert str(bad.pk) in lines[-1] and "1 job(s)" in lines[-1]
    burst()
    labels = sorted(Record.objects.values_list("label", flat=True))
    assert [label for label in labels if label != "poison"] == [f"good-{i}" for i in range(5)]
    for job in good:
        assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED
    # The poison row is settled, not left waiting: run (it reads back, and a time before
    # 1970 is overdue) or dead with the reason (it does not read back).
    row = Job.objects.filter(pk=bad.pk).values_list("status", "last_error").get()
    if row[0] == Status.SUCCEEDED:
        assert labels.count("poison") == 1
    else:
        assert row[0] == Status.DEAD and "cannot be read back" in row[1], row
        assert "poison" not in labels


def test_delayjobs_reconcile_command_names_poison_rows(redis_client):
    bad = [poisoned("run_at 1969"), poisoned("run_at 9999")]
    [schedule(tasks.record, in_=0, args=[f"good-{i}"]) for i in range(5)]
    age_rows()
    redis_client.flushall()
    out = StringIO()
    call_command("delayjobs_reconcile", stdout=out)
    assert "repaired 7 job(s)" in out.getvalue()  # the 9999 one is valid, just far away
    assert f"{bad[0].pk}: due time unusable" in out.getvalue()
    burst()
    assert Record.objects.count() == 6  # the five, and the overdue 1969 one
    assert Job.objects.get(pk=bad[1].pk).status == Status.SCHEDULED  # not due until 9999


@pytest.mark.slow
def test_a_worker_keeps_repairing_with_a_poison_row_in_the_table(redis_url, redis_client):
    """The reconcile thread of a real worker survives the row that used to kill it, and the
    row is settled: a job due in 1969 is simply overdue."""
    bad = poisoned("run_at 1969")
    for i in range(5):
        schedule(tasks.record, in_=0, args=[f"good-{i}"])
    redis_client.flushall()  # Redis loses everything
    worker = start_worker(redis_url, env={"DELAYJOBS_RECONCILE_SECONDS": "1"})
    try:
        wait_for(lambda: Record.objects.count() == 6, timeout=60)
        assert worker.poll() is None
    finally:
        assert stop(worker) == 0
    assert Record.objects.count() == 6
    assert Job.objects.get(pk=bad.pk).status == Status.SUCCEEDED


def plant_queue(job: Job, queue: str) -> None:
    """Give ``job`` a queue no Redis key can carry, with raw SQL (an older version's)."""
    table, quote = connection.ops.quote_name(Job._meta.db_table), connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET {quote('queue')} = %s WHERE {quote('id')} = %s",
            [queue, Job._meta.pk.get_db_prep_value(job.pk, connection)],
        )


def test_reconcile_skips_a_row_whose_queue_cannot_name_redis_keys_and_names_it(redis_client,
                                                                              caplog):  # fmt: skip
    bad = schedule(tasks.record, in_=0, args=["poison"])
    plant_queue(bad, "old queue")
    [schedule(tasks.record, in_=0, args=[f"good-{i}"]) for i in range(5)]
    age_rows()
    redis_client.flushall()
    with caplog.at_level(logging.WARNING, logger="django_delayjobs.reconcile"):
        repaired = reconcile(get_engine(), horizon=horizon())
    assert repaired["default"] == 5
    assert list(repaired.skipped) == [str(bad.pk)]
    assert "'old queue' is not valid" in repaired.skipped[str(bad.pk)]
    (line,) = [r.getMessage() for r in caplog.records if "no worker can claim" in r.getMessage()]
    assert str(bad.pk) in line and "1 job(s)" in line
    out = StringIO()
    call_command("delayjobs_reconcile", stdout=out)
    assert f"{str(bad.pk)!r}: skipped (queue 'old queue' is not valid" in out.getvalue()
    burst()
    assert Record.objects.count() == 5
    assert Job.objects.get(pk=bad.pk).status == Status.SCHEDULED  # left for a person to fix


def test_a_worker_keeps_running_beside_a_row_whose_queue_cannot_name_redis_keys(caplog):
    """The reconcile thread used to die on such a row, and the worker with it (exit 1)
    at every start."""
    bad = schedule(tasks.record, in_=60, args=["poison"])  # within the sweep's horizon
    plant_queue(bad, "old queue")
    process = WorkerProcess(get_engine(), Options(queues=["default"], tick=0.1))
    thread = threading.Thread(target=process.run)
    thread.start()
    try:
        wait_for(lambda: "no worker can claim" in caplog.text)
        schedule(tasks.record, in_=0, args=["healthy"])
        wait_for(lambda: Record.objects.filter(label="healthy").exists())
        assert process.fatal is None and thread.is_alive()
    finally:
        process.stop()
        thread.join(10)


# -- the admin and the API render poison rows ---------------------------------------------


@pytest.fixture
def superuser_clients(client):
    user = make_user("root", superuser=True)
    client.force_login(user)
    return client, client_for(user)


def test_the_pages_that_list_queues_leave_out_a_queue_that_cannot_name_redis_keys(
    superuser_clients, settings
):
    """Every queue of an active job is listed, each read from Redis: a name Redis keys
    cannot carry raised ValueError in the queue page and the API (500s)."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "METRICS_TOKEN": "t" * 32}
    admin, api = superuser_clients
    plant_queue(schedule(tasks.record, in_=60, args=["poison"]), "old queue")
    pages = {
        "admin queues": admin.get(reverse(QUEUES)),
        "admin queues, charts": admin.get(reverse(QUEUES), {"charts": "1h"}),
        "api queues": api.get(url("queues")),
        "metrics": admin.get(reverse("delayjobs_metrics"), HTTP_AUTHORIZATION="Bearer " + "t" * 32),
    }
    for page, response in pages.items():
        assert response.status_code == 200, (page, response.content[:300])
    assert [q["queue"] for q in pages["api queues"].json()["queues"]] == ["default"]


@pytest.mark.parametrize("name", list(POISON))
def test_admin_and_api_render_a_poison_row(name, superuser_clients):
    admin, api = superuser_clients
    normal = schedule(tasks.record, in_=60, args=["normal"])
    bad = poisoned(name)
    pages = {
        "admin list": admin.get(reverse(CHANGELIST)),
        "admin detail": admin.get(reverse(CHANGE, args=[bad.pk])),
        "admin queues": admin.get(reverse(QUEUES)),
        "api list": api.get(url("jobs")),
        "api list soonest first": api.get(url("jobs"), {"ordering": "run_at"}),
        "api detail": api.get(url("jobs", bad.pk)),
        "api queues": api.get(url("queues")),
    }
    for page, response in pages.items():
        assert response.status_code == 200, (page, response.content[:300])
    listed = pages["admin list"].content.decode()
    assert str(bad.pk)[-8:] in listed and str(normal.pk)[-8:] in listed
    for page in ("api list", "api list soonest first"):
        ids = [job["id"] for job in pages[page].json()["results"]]
        assert sorted(ids) == sorted([str(bad.pk), str(normal.pk)]), page
    assert pages["api detail"].json()["id"] == str(bad.pk)


@pytest.mark.parametrize(
    "literal", ["'2026-02-30 10:00:00'", "'infinity'", "'10000-01-01 00:00:00+00'"]
)
def test_admin_and_api_render_a_history_event_that_cannot_be_read(literal, superuser_clients):
    """An event whose time Python cannot read (30 February in SQLite, 'infinity' or year
    10000 in PostgreSQL) is shown as stored, with the rest of the job's history."""
    if (literal == "'2026-02-30 10:00:00'") != sqlite():
        pytest.skip(f"{literal} cannot be stored in {connection.vendor}")
    admin, api = superuser_clients
    job = schedule(tasks.record, in_=60, args=["x"])
    job.reschedule(in_=120, actor="admin:bob")
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {quote(JobEvent._meta.db_table)} SET {quote('at')} = {literal} "
            f"WHERE {quote('id')} = %s",
            [job.events.order_by("id").first().pk],
        )
    pages = {
        "admin detail": admin.get(reverse(CHANGE, args=[job.pk])),
        "api detail": api.get(url("jobs", job.pk)),
        "api events": api.get(url("jobs", job.pk, "events")),
    }
    for page, response in pages.items():
        assert response.status_code == 200, (page, response.content[:300])
    stored = literal.strip("'")
    assert f"{stored} (unreadable)" in pages["admin detail"].content.decode()
    for events in (pages["api detail"].json()["events"], pages["api events"].json()["results"]):
        assert [(e["kind"], e["at"] == stored) for e in events] == [
            ("scheduled", True), ("rescheduled", False),
        ]  # fmt: skip


@pytest.mark.parametrize("name", ["run_at 9999", "run_at infinity", "run_at 1969"])
def test_api_pages_walk_past_a_poison_row(name, superuser_clients):
    _, api = superuser_clients
    jobs = {str(schedule(tasks.record, in_=60 + i, args=[str(i)]).pk) for i in range(3)}
    jobs.add(str(poisoned(name).pk))
    for ordering in ("run_at", "-run_at"):
        seen: list[str] = []
        response = api.get(url("jobs"), {"page_size": 1, "ordering": ordering})
        while True:
            assert response.status_code == 200, response.content[:300]
            seen += [job["id"] for job in response.json()["results"]]
            if response.json()["next"] is None:
                break
            response = api.get(response.json()["next"])
        assert sorted(seen) == sorted(jobs), ordering


@pytest.mark.parametrize("time_zone", ["UTC", "Pacific/Kiritimati", "America/Los_Angeles"])
def test_year_9999_and_year_1_do_not_break_the_date_drill_down(time_zone, settings, admin_client):
    """Finding 3: the changelist's date hierarchy overflowed on a job due in year 9999."""
    settings.TIME_ZONE = time_zone
    for when in (datetime.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=datetime.UTC),
                 datetime.datetime(1, 1, 1, tzinfo=datetime.UTC)):  # fmt: skip
        job = schedule(tasks.record, in_=60, args=["x"])
        Job.objects.filter(pk=job.pk).update(run_at=when)
    schedule(tasks.record, in_=60, args=["now"])
    base = reverse(CHANGELIST)
    drill = [(9999,), (9999, 12), (9999, 12, 31), (1,), (1, 1), (1, 1, 1), (2026, 2, 30)]
    for parts in [(), *drill, (10000,), (0,)]:
        query = dict(zip(["run_at__year", "run_at__month", "run_at__day"], parts, strict=False))
        response = admin_client.get(base, query)
        wrong = parts in [(10000,), (0,), (2026, 2, 30)]  # Django's "?e=1" redirect
        assert response.status_code == (302 if wrong else 200), (query, response.status_code)
    response = admin_client.get(base)
    assert response.status_code == 200
    assert "9999" in response.content.decode()


def test_a_row_that_vanished_is_not_a_poison_row(superuser_clients):
    _, api = superuser_clients
    assert api.get(url("jobs", uuid.uuid4())).status_code == 404


def rename_column(old: str, new: str) -> None:
    table = connection.ops.quote_name(Job._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} RENAME COLUMN {old} TO {new}")


@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="SQLite reads a quoted column name it does not know as a string: its claim works",
)
def test_a_schema_behind_the_code_hands_the_job_back_instead_of_burying_it():
    """A worker of a new version started before ``migrate`` (a column its statements name
    is not there yet): the database refuses the claim, whatever the row holds. That is
    no poison row: the job is handed back, costs no attempt, and runs once migrated."""
    job = schedule(tasks.record, in_=0, args=["migrated"])
    rename_column("result", "result_later")  # as if a migration had not added it yet
    try:
        with pytest.raises(CommandError, match="handed back 1 job"):
            call_command("run_delayworker", "--burst", "-v", "0")
    finally:
        rename_column("result_later", "result")
    job.refresh_from_db()
    assert (job.status, job.attempts, job.last_error) == (Status.SCHEDULED, 0, "")
    get_engine().add("default", {str(job.pk): 0})  # handed back due in 1 s: due now
    call_command("run_delayworker", "--burst", "-v", "0")
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.SUCCEEDED, 1)


# -- changing a poison row through the admin and the API ----------------------------------


def test_admin_actions_walk_past_a_row_without_a_readable_id():
    """The row is left out of its batch, which comes back short: the walk must go on to
    the rows after it (SQLite alone can hold an id that is not a UUID)."""
    if not sqlite():
        pytest.skip("PostgreSQL's uuid column holds only UUIDs")
    jobs = sorted((schedule(tasks.record, in_=60, args=[str(i)]) for i in range(6)),
                  key=lambda job: job.pk.hex)  # fmt: skip
    bad = schedule(tasks.record, in_=60, args=["bad"])
    bad.events.all().delete()  # their foreign key would refuse the new id
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:  # sorts right after the third job's id
        cursor.execute(
            f"UPDATE {quote(Job._meta.db_table)} SET {quote('id')} = %s WHERE {quote('id')} = %s",
            [jobs[2].pk.hex[:-1] + "z", bad.pk.hex],
        )
    walked = [job.pk for job in operations.walk(tolerant(Job.objects.all()), batch=2)]
    assert walked == [job.pk for job in jobs]


@pytest.mark.parametrize(
    "name", ["run_at 1969", "run_at infinity", "run_at not a date", "expires_at infinity"]
)
def test_admin_actions_and_api_verbs_on_a_poison_row_never_500(name, superuser_clients):
    admin, api = superuser_clients
    bad = poisoned(name)
    changelist = reverse(CHANGELIST)
    response = admin.post(changelist, {"action": "run_now", ACTION_CHECKBOX_NAME: [bad.pk]})
    assert response.status_code == 302
    if name != "expires_at infinity":  # "run now" writes a readable due time: repaired
        assert Job.objects.get(pk=bad.pk).run_at <= timezone.now()
    response = api.post(url("jobs", bad.pk, "reschedule"), {"in": 0}, format="json")
    assert response.status_code == (400 if name == "expires_at infinity" else 200)
    response = api.post(url("jobs", bad.pk, "cancel"), {}, format="json")
    assert response.status_code == 200
    assert Job.objects.filter(pk=bad.pk).values_list("status", flat=True).get() == "cancelled"


def test_the_queue_page_shows_a_job_due_in_year_9999_in_a_zone_ahead_of_utc(
    settings, superuser_clients, redis_client
):
    settings.TIME_ZONE = "Pacific/Kiritimati"  # UTC+14
    admin, api = superuser_clients
    job = schedule(tasks.record, in_=60, args=["x"])
    last = datetime.datetime(9999, 12, 31, 23, 59, tzinfo=datetime.UTC)
    Job.objects.filter(pk=job.pk).update(run_at=last)
    redis_client.flushall()
    reconcile(get_engine())  # Redis now holds it, due in year 9999
    assert admin.get(reverse(QUEUES)).status_code == 200
    assert api.get(url("queues")).status_code == 200
    assert admin.get(reverse(CHANGE, args=[job.pk])).status_code == 200


def queue_pages(settings, admin, api) -> dict[str, HttpResponse]:
    """The answers of every page that shows the queues' state (the metrics by token)."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "METRICS_TOKEN": "t" * 32}
    return {
        "admin queues": admin.get(reverse(QUEUES)),
        "api queues": api.get(url("queues")),
        "health": admin.get(reverse("delayjobs_health")),
        "metrics": admin.get(reverse("delayjobs_metrics"), HTTP_AUTHORIZATION="Bearer " + "t" * 32),
    }


@pytest.mark.parametrize("score", ["inf", "1e20", MAX_DUE_MS])
def test_the_pages_that_show_queues_answer_with_a_time_in_redis_past_year_9999(
    superuser_clients, redis_client, settings, score
):
    """Add accepts ``MAX_DUE_MS`` (a row due at datetime.max is re-added there), which as a
    datetime is year 10000, and a key another program wrote may hold any score: the queue
    page and queues/ answered 500 (ValueError, OSError, OverflowError), and so did
    health/ and metrics/ for +inf."""
    admin, api = superuser_clients
    engine = get_engine()
    k = engine.keys("default")
    for key in (k.pending, k.unack, k.garbage, k.workers):
        redis_client.zadd(key, {str(uuid.uuid4()): score})
    pages = queue_pages(settings, admin, api)
    for page, response in pages.items():
        assert response.status_code == 200, (page, response.content[:300])
    assert pages["admin queues"].context["redis_error"] == ""
    [queue] = pages["api queues"].json()["queues"]
    assert queue["next_due_at"].startswith("9999-12-31T23:59:59.999999")


#: Descriptions of live workers that no worker of this version writes.
ODD_WORKER_INFO = [
    b"not json",
    b"\xff\xfe",
    b"[1, 2]",
    b'{"pid": "abc", "roles": 5, "concurrency": "x", "queues": "default", "host": null}',
    b'{"expires_ms": "soon", "id": 7, "roles": [1, null]}',
]


@pytest.mark.parametrize("info", ODD_WORKER_INFO)
def test_the_pages_that_show_queues_answer_with_a_worker_description_no_worker_wrote(
    superuser_clients, redis_client, info
):
    """The queue page and queues/ read each live worker's description as JSON and used
    its fields as they found them: a value that is not a JSON object, or a field of
    another type, was a 500 (JSONDecodeError, TypeError, ValueError)."""
    admin, api = superuser_clients
    engine = get_engine()
    engine.heartbeat("default", "w1", 60_000, {"pid": 1})
    redis_client.hset(engine.keys("default").worker_info, "w1", info)
    page = admin.get(reverse(QUEUES))
    assert page.status_code == 200, page.content[:300]
    assert page.context["redis_error"] == ""
    response = api.get(url("queues"))
    assert response.status_code == 200, response.content[:300]
    [worker] = response.json()["queues"][0]["workers"]
    assert worker["id"] == "w1" and worker["expires_at"] is not None


@pytest.mark.parametrize("value", [b"abc", b"1.5", b""])
def test_the_pages_that_show_queues_answer_with_a_counter_no_script_wrote(
    superuser_clients, redis_client, settings, value
):
    """Stats read the queue's counters hash with int(): a value of another program's that
    is not an integer made stats raise ValueError, a 500 from the queue page, queues/,
    health/ and metrics/. Such a counter is left out."""
    admin, api = superuser_clients
    engine = get_engine()
    engine.add("default", {str(uuid.uuid4()): 1.0})
    redis_client.hset(engine.keys("default").counters, "odd", value)
    pages = queue_pages(settings, admin, api)
    for page, response in pages.items():
        assert response.status_code in (200, 503), (page, response.content[:300])
    [queue] = pages["api queues"].json()["queues"]
    assert queue["counters"] == {"added": 1}
