"""Metrics: what each outcome counts, the Redis layout, flushing through an outage, the
view's access rules and its answers when Redis or prometheus_client is missing."""

from __future__ import annotations

import datetime
import math
import socket
import sys

import pytest
import redis
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from django_delayjobs import schedule
from django_delayjobs.checks import check_settings
from django_delayjobs.connection import get_engine
from django_delayjobs.engine import EngineUnavailable
from django_delayjobs.metrics import exposition, layout, snapshot, store
from django_delayjobs.metrics.recorder import Recorder, fields_of
from django_delayjobs.models import Job
from django_delayjobs.outcomes import Outcome, Result
from tests.helpers import unreachable_engine
from tests.test_retention import database_down
from tests.testapp import tasks

parser = pytest.importorskip("prometheus_client.parser")

TOKEN = "a-token-of-32-characters-or-so-x"
T0 = datetime.datetime(2030, 1, 1, 12, 0, tzinfo=datetime.UTC)


def job(late: float = 0.25, action: str = "shop.Order.cancel") -> Job:
    started = T0 + datetime.timedelta(seconds=late)
    return Job(run_at=T0, started_at=started, attempts=1, action=action)


def result(outcome: Outcome, *, ran: bool = True, failed: bool = False, late: float = 0.25,
           action: str = "shop.Order.cancel") -> Result:  # fmt: skip
    return Result(outcome, job(late, action), failed=failed, duration=0.04 if ran else None)


# -- what each outcome counts ------------------------------------------------------------


@pytest.mark.parametrize(
    ("res", "jobs"),
    [
        (result(Outcome.SUCCEEDED), {"succeeded"}),
        (result(Outcome.RETRYING, failed=True), {"failed", "retried"}),
        (result(Outcome.DEAD, failed=True), {"failed", "dead"}),
        (result(Outcome.DEAD, ran=False), {"dead"}),  # could not run at all: no attempt failed
        (result(Outcome.SKIPPED, ran=False), {"skipped"}),
    ],
)
def test_each_outcome_counts_its_labels_once(res, jobs):
    fields = dict(fields_of(res))
    assert {k.removeprefix("jobs:") for k in fields if k.startswith("jobs:")} == jobs
    assert all(fields[f"jobs:{j}"] == 1 for j in jobs)
    observed = res.duration is not None
    assert ("lateness:0.5" in fields) == observed  # 250 ms late: the (0.2, 0.5] bucket
    assert ("run:0.05" in fields) == observed  # 40 ms run: the (0.025, 0.05] bucket
    if observed:
        assert fields["lateness:sum"] == pytest.approx(0.25)
        assert fields["run:sum"] == pytest.approx(0.04)


@pytest.mark.parametrize(
    "outcome", [Outcome.DROPPED, Outcome.DEFERRED, Outcome.HANDED_BACK, Outcome.OVERTAKEN]
)
def test_deliveries_that_change_nothing_count_nothing(outcome):
    assert fields_of(Result(outcome, job())) == []


@pytest.mark.parametrize(
    ("seconds", "field"),
    [(0, "lateness:0.001"), (0.001, "lateness:0.001"), (0.0011, "lateness:0.002"),
     (59.9, "lateness:60.0"), (60.0, "lateness:60.0"), (61, "lateness:+Inf"),
     (1e9, "lateness:+Inf")],
)  # fmt: skip
def test_lateness_buckets_run_from_1_ms_to_60_s(seconds, field):
    assert layout.bucket_field("lateness", seconds) == field
    assert layout.LATENESS_BUCKETS[0] == 0.001 and layout.LATENESS_BUCKETS[-1] == 60


def test_a_job_started_before_its_run_at_is_counted_as_on_time():
    fields = dict(fields_of(result(Outcome.SUCCEEDED, late=-3)))
    assert fields["lateness:0.001"] == 1 and fields["lateness:sum"] == 0


def test_quantiles_interpolate_within_buckets_like_histogram_quantile():
    counts = layout.buckets(
        "lateness", {"lateness:0.01": 50, "lateness:0.1": 49, "lateness:1.0": 1}
    )
    assert layout.quantile(0.5, counts) == pytest.approx(0.01)
    assert layout.quantile(0.99, counts) == pytest.approx(0.1)
    # Within a bucket, from the previous bound (even of an empty bucket) to its own.
    assert layout.quantile(0.25, counts) == pytest.approx(0.005 + 0.005 * 25 / 50)
    assert layout.quantile(0.995, counts) == pytest.approx(0.5 + 0.5 * 0.5)
    assert layout.quantile(0.5, layout.buckets("lateness", {})) is None
    beyond = layout.buckets("lateness", {"lateness:+Inf": 3})
    assert layout.quantile(0.5, beyond) == 60.0  # past the last bound: the last bound


# -- Redis layout and flushing -------------------------------------------------------------


# -- per-action series (METRICS_ACTIONS) ---------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["shop.Order.cancel", [1], ["has space.x"], ["a|b"], [""], ["9lives.x"], ["a." + "b" * 199],
     [f"app.f{n}" for n in range(51)], ["a.b", "a.b"], None],
)  # fmt: skip
def test_metrics_actions_is_checked(value, settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "METRICS_ACTIONS": value}
    assert [e for e in check_settings() if "METRICS_ACTIONS" in e.msg] != []


def test_metrics_actions_takes_every_kind_of_action_name(settings):
    names = ["shop.Order.cancel", "task:shop.tasks.send", "django_delayjobs.callbacks.deliver"]
    for value in (names, [f"app.f{n}" for n in range(50)]):
        settings.DELAYJOBS = {**settings.DELAYJOBS, "METRICS_ACTIONS": value}
        assert check_settings() == []


@pytest.mark.django_db
def test_only_the_named_actions_get_series_of_their_own(engine, settings):
    recorder = Recorder()
    engine.add("q", {"x": 10**13})  # the queue is known
    other = "shop.Order.remind"
    outcomes = [(Outcome.SUCCEEDED, False), (Outcome.SUCCEEDED, False),
                (Outcome.RETRYING, True), (Outcome.DEAD, True)]  # fmt: skip
    base = settings.DELAYJOBS
    settings.DELAYJOBS = {**base, "METRICS_ACTIONS": ["shop.Order.cancel"]}
    at = T0.timestamp()
    for outcome, failed in outcomes:
        recorder.record("q", result(outcome, failed=failed), now=at)
        recorder.record("q", result(outcome, failed=failed, action=other), now=at)
    recorder.flush(engine, [], now=at)
    minute = store.minutes(engine, "q", int(at // 60), int(at // 60))
    assert minute and not any(k.startswith("action|") for f in minute.values() for k in f)
    text = exposition.render(snapshot.read(engine)).decode()
    families = {f.name: f for f in parser.text_string_to_metric_families(text)}
    jobs = {(s.labels["action"], s.labels["outcome"]): s.value
            for s in families["delayjobs_action_jobs"].samples
            if s.name.endswith("_total") and s.labels["queue"] == "q"}  # fmt: skip
    assert jobs == {("shop.Order.cancel", "succeeded"): 2, ("shop.Order.cancel", "failed"): 2,
                    ("shop.Order.cancel", "retried"): 1, ("shop.Order.cancel", "dead"): 1,
                    ("shop.Order.cancel", "skipped"): 0}  # fmt: skip
    run = {s.name: s.value for s in families["delayjobs_action_run_seconds"].samples
           if s.labels["queue"] == "q" and s.labels.get("le") in (None, "0.05")}  # fmt: skip
    assert run["delayjobs_action_run_seconds_count"] == 4
    assert run["delayjobs_action_run_seconds_bucket"] == 4  # 40 ms each
    assert run["delayjobs_action_run_seconds_sum"] == pytest.approx(0.16)
    # The queue's own series count both actions.
    totals = {s.labels["outcome"]: s.value for s in families["delayjobs_jobs"].samples
              if s.name.endswith("_total") and s.labels["queue"] == "q"}  # fmt: skip
    assert totals["succeeded"] == 4 and totals["dead"] == 2
    # Not named any more: the series go, whatever Redis still holds.
    settings.DELAYJOBS = base
    text = exposition.render(snapshot.read(engine)).decode()
    assert "delayjobs_action" not in text


def key_ttl(client: redis.Redis, key: str) -> int:
    return int(client.ttl(key))


def test_a_flush_writes_totals_and_the_minute_under_the_queue_hash_tag(engine, redis_client):
    recorder = Recorder()
    minute = int(T0.timestamp() // 60)
    for _ in range(3):
        recorder.record("q", result(Outcome.SUCCEEDED), now=T0.timestamp())
    recorder.record("q", result(Outcome.RETRYING, failed=True), now=T0.timestamp() + 60)
    engine.add("q", {"x": 10**13})
    recorder.flush(engine, ["q"], now=T0.timestamp() + 61)

    totals = store.totals(engine, ["q"])["q"]
    assert totals["jobs:succeeded"] == 3 and totals["jobs:retried"] == 1
    assert totals["jobs:failed"] == 1 and totals["lateness:0.5"] == 4
    assert totals["lateness:sum"] == pytest.approx(1.0)
    minutes = store.minutes(engine, "q", minute - 5, minute + 5)
    assert set(minutes) == {minute, minute + 1}
    assert minutes[minute]["jobs:succeeded"] == 3
    assert minutes[minute + 1]["jobs:retried"] == 1
    assert minutes[minute + 1]["snap:added"] == 1  # the engine's counter at that minute
    keys = {k.decode() for k in redis_client.keys("*metrics*")}
    assert keys == {"{t:q}:metrics", f"{{t:q}}:metrics:{minute}", f"{{t:q}}:metrics:{minute + 1}"}
    assert key_ttl(redis_client, "{t:q}:metrics") == -1  # totals never expire
    assert 3 * 3600 < key_ttl(redis_client, f"{{t:q}}:metrics:{minute}") <= 3 * 3600 + 120
    assert recorder.tallies == {}


def test_the_minute_snapshot_is_the_first_one_taken(engine):
    minute = int(T0.timestamp() // 60)
    first, second = Recorder(), Recorder()
    engine.add("q", {"a": 10**13})
    first.flush(engine, ["q"], now=T0.timestamp())
    engine.add("q", {"b": 10**13})
    second.flush(engine, ["q"], now=T0.timestamp() + 30)  # another process, same minute
    first.flush(engine, ["q"], now=T0.timestamp() + 31)  # taken already: not again
    assert store.minutes(engine, "q", minute, minute)[minute]["snap:added"] == 1


def test_counts_survive_a_failed_flush_and_are_written_once(engine, redis_client):
    down = unreachable_engine()
    recorder = Recorder()
    recorder.record("q", result(Outcome.SUCCEEDED), now=T0.timestamp())
    with pytest.raises(EngineUnavailable):
        recorder.flush(down, ["q"], now=T0.timestamp())
    recorder.record("q", result(Outcome.SUCCEEDED), now=T0.timestamp())
    recorder.flush(engine, ["q"], now=T0.timestamp() + 1)
    recorder.flush(engine, ["q"], now=T0.timestamp() + 2)
    assert store.totals(engine, ["q"])["q"]["jobs:succeeded"] == 2


def test_a_flush_failing_for_one_queue_keeps_only_that_queues_counts(engine, redis_client):
    """One MULTI/EXEC per queue: when ``b``'s fails (its Cluster master down, say), ``a``'s
    counts are in Redis already and no later flush adds them again; ``b``'s are kept until
    ``b`` can be written."""
    recorder = Recorder()
    for queue in ("a", "b", "c"):
        recorder.record(queue, result(Outcome.SUCCEEDED), now=T0.timestamp())
    redis_client.set(store.totals_key(engine, "b"), "x")  # b cannot be written
    for second in range(3):
        with pytest.raises(EngineUnavailable):
            recorder.flush(engine, ["a", "b", "c"], now=T0.timestamp() + second)
        # The queues after the failing one are written too, once.
        assert store.totals(engine, ["c"])["c"]["jobs:succeeded"] == 1
    redis_client.delete(store.totals_key(engine, "b"))
    recorder.flush(engine, ["a", "b", "c"], now=T0.timestamp() + 3)
    totals = store.totals(engine, ["a", "b", "c"])
    assert [totals[q]["jobs:succeeded"] for q in "abc"] == [1, 1, 1]


def test_minutes_older_than_the_history_are_not_written(engine):
    recorder = Recorder()
    old = T0.timestamp() - 4 * 3600  # HISTORY_HOURS is 3
    recorder.record("q", result(Outcome.SUCCEEDED), now=old)
    recorder.flush(engine, [], now=T0.timestamp())
    assert store.totals(engine, ["q"])["q"]["jobs:succeeded"] == 1
    minute = int(old // 60)
    assert store.minutes(engine, "q", minute - 1, minute + 1) == {}


# -- the snapshot's gauges -------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_oldest_overdue_counts_pending_and_ready_jobs():
    engine = get_engine()
    now = datetime.datetime.now(tz=datetime.UTC)
    first = schedule(tasks.record, at=now - datetime.timedelta(seconds=50), args=["a"])
    schedule(tasks.record, at=now - datetime.timedelta(seconds=20), args=["b"])
    (reading,) = snapshot.read(engine)  # no promoter ran: the head of pending is overdue
    assert reading.stats.ready == 2 and reading.stats.overdue == 0  # add put them in ready
    assert 50 <= reading.oldest_overdue < 60
    assert first.cancel()  # the oldest ready entry is a tombstone now
    (reading,) = snapshot.read(engine)
    assert 20 <= reading.oldest_overdue < 30
    engine.claim("default", 1)
    assert snapshot.read(engine)[0].oldest_overdue == 0
    # An id handed back with an old retry time waits in pending, overdue, for a promoter.
    engine.add("default", {"x": 0})
    assert engine.claim("default", 1) == ["x"]
    engine.nack("default", {"x": engine.server_time_ms() - 7000})
    (reading,) = snapshot.read(engine)
    assert reading.stats.overdue == 1
    assert 7 <= reading.oldest_overdue < 15


# -- the view: who may read it -------------------------------------------------------------


def metrics_url() -> str:
    return reverse("delayjobs_metrics")


def user(name: str, *, staff: bool = True, perms: tuple[str, ...] = (), su: bool = False):
    u = User.objects.create_user(name, password="pw", is_staff=staff, is_superuser=su)
    for codename in perms:
        u.user_permissions.add(
            Permission.objects.get(content_type__app_label="django_delayjobs", codename=codename)
        )
    return u


def get(client: Client, token: str | None = None, **headers: str):
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return client.get(metrics_url(), headers=headers)


@pytest.fixture
def with_token(settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "METRICS_TOKEN": TOKEN}


@pytest.mark.django_db
def test_anonymous_wrong_and_malformed_tokens_get_401(with_token):
    client = Client()
    for response in (get(client), get(client, "wrong"), get(client, TOKEN[:-1]),
                     get(client, TOKEN + "x"), get(client, Authorization=f"Basic {TOKEN}"),
                     get(client, Authorization=TOKEN)):  # fmt: skip
        assert response.status_code == 401
        assert response["WWW-Authenticate"].startswith("Bearer")
        assert b"delayjobs_" not in response.content
        assert "no-store" in response["Cache-Control"]


@pytest.mark.django_db
def test_a_wrong_token_is_refused_even_with_a_staff_session(with_token):
    client = Client()
    client.force_login(user("boss", su=True))
    assert get(client, "wrong-token-wrong-token").status_code == 401
    assert get(client).status_code == 200


@pytest.mark.django_db
def test_other_credentials_leave_a_logged_in_user_who_may_not_read_metrics_403(with_token):
    """A site behind HTTP Basic auth sends ``Authorization: Basic ...`` on every request:
    only a Bearer token makes a scrape a token's (a wrong one is 401)."""
    client = Client()
    client.force_login(user("bob", staff=False))
    assert get(client, Authorization="Basic Ym9iOnB3").status_code == 403
    assert get(client, "wrong-token").status_code == 401


@pytest.mark.django_db
def test_without_a_token_setting_no_token_opens_it():
    assert get(Client(), "").status_code == 401
    assert get(Client(), "None").status_code == 401


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("kwargs", "status"),
    [({"staff": False, "perms": ("view_job",)}, 403), ({"staff": True}, 403),
     ({"staff": True, "perms": ("view_job",)}, 200),
     ({"staff": True, "perms": ("change_job",)}, 200),
     ({"staff": True, "su": True}, 200)],
)  # fmt: skip
def test_staff_who_may_view_jobs_get_the_metrics(kwargs, status):
    client = Client()
    client.force_login(user("u", **kwargs))
    response = get(client)
    assert response.status_code == status
    assert (b"delayjobs_jobs_total" in response.content) == (status == 200)


@pytest.mark.django_db
def test_an_inactive_staff_user_is_refused():
    u = user("gone", su=True)
    client = Client()
    client.force_login(u)
    User.objects.filter(pk=u.pk).update(is_active=False)
    assert get(client).status_code in (401, 403)


@pytest.mark.django_db(transaction=True)
def test_the_token_gets_every_series_of_every_queue(with_token):
    schedule(tasks.record, in_=60, args=["x"], queue="mail")
    response = get(Client(), TOKEN)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    families = {f.name: f for f in parser.text_string_to_metric_families(response.content.decode())}
    assert set(families) == {
        "delayjobs_jobs", "delayjobs_lateness_seconds", "delayjobs_run_seconds",
        "delayjobs_queue_jobs", "delayjobs_oldest_overdue_seconds", "delayjobs_workers",
        "delayjobs_queue_readable", "delayjobs_directory_readable",
    }  # fmt: skip
    assert families["delayjobs_jobs"].type == "counter"
    assert families["delayjobs_lateness_seconds"].type == "histogram"
    jobs = {(s.labels["queue"], s.labels["outcome"]): s.value
            for s in families["delayjobs_jobs"].samples if s.name.endswith("_total")}  # fmt: skip
    assert set(jobs) == {(q, o) for q in ("default", "mail") for o in layout.OUTCOMES}
    assert jobs[("mail", "scheduled")] == 1 and jobs[("default", "scheduled")] == 0
    states = {(s.labels["queue"], s.labels["state"]): s.value
              for s in families["delayjobs_queue_jobs"].samples}  # fmt: skip
    assert states[("mail", "pending")] == 1
    assert {s for _, s in states} == {"pending", "overdue", "ready", "in_flight", "garbage"}
    les = [s.labels["le"] for s in families["delayjobs_lateness_seconds"].samples
           if s.name.endswith("_bucket") and s.labels["queue"] == "mail"]  # fmt: skip
    assert les[0] == "0.001" and les[-2:] == ["60.0", "+Inf"]
    for family in families.values():  # bounded labels: never a job id
        for s in family.samples:
            assert set(s.labels) <= {"queue", "outcome", "state", "le"}


@pytest.mark.django_db
def test_only_get_and_head(with_token):
    client = Client()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert client.post(metrics_url(), headers=auth).status_code == 405
    assert client.head(metrics_url(), headers=auth).status_code == 200


@pytest.mark.django_db
def test_redis_down_gives_503(with_token, settings):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": f"redis://127.0.0.1:{port}/0"}
    response = get(Client(), TOKEN)
    assert response.status_code == 503
    assert response.content == b"Redis is unavailable\n"


@pytest.mark.django_db(transaction=True)
def test_database_down_gives_503_from_the_view_and_the_workers_port(with_token, tmp_path):
    """A ready job's due time is its row's: with the database down the scrape failed
    with a 500 (the view) or a traceback (the worker's port) instead of saying why."""
    from django_delayjobs.metrics import server

    schedule(tasks.record, in_=0, args=["ready"])
    assert get_engine().stats("default").ready == 1
    statuses: list[str] = []
    environ = {"PATH_INFO": "/metrics", "REQUEST_METHOD": "GET",
               "HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}  # fmt: skip
    with database_down(tmp_path):
        response = get(Client(), TOKEN)
        body = server.app(environ, lambda status, headers: statuses.append(status))
    assert response.status_code == 503
    assert response.content == b"the database is unavailable\n"
    assert statuses == ["503 Service Unavailable"]
    assert b"".join(body) == b"the database is unavailable\n"


@pytest.mark.django_db(transaction=True)
def test_database_down_gives_503_to_a_staff_session_too(tmp_path):
    """A session's user is read from the database: with it down, a staff user's scrape
    was a 500 (the error escaped from the access check)."""
    client = Client(raise_request_exception=False)
    client.force_login(user("boss", su=True))
    with database_down(tmp_path):
        response = client.get(metrics_url())
    assert response.status_code == 503
    assert response.content == b"the database is unavailable\n"


@pytest.mark.django_db
def test_without_prometheus_client_the_view_says_what_to_install(with_token, monkeypatch):
    import django_delayjobs.metrics as package

    monkeypatch.delitem(sys.modules, "django_delayjobs.metrics.exposition", raising=False)
    monkeypatch.delattr(package, "exposition", raising=False)
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    response = get(Client(), TOKEN)
    assert response.status_code == 501
    assert b"django-delayjobs[metrics]" in response.content
    assert get(Client()).status_code == 401  # refused before anything else


# -- settings ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "check_id"),
    [({"METRICS_TOKEN": "short"}, "django_delayjobs.E006"),
     ({"METRICS_TOKEN": "has a space in it somewhere"}, "django_delayjobs.E006"),
     ({"METRICS_TOKEN": "é" * 20}, "django_delayjobs.E006"),
     ({"METRICS_TOKEN": 12345678901234567890}, "django_delayjobs.E006"),
     ({"METRICS_HISTORY_HOURS": 0}, "django_delayjobs.E004"),
     ({"METRICS_HISTORY_HOURS": 49}, "django_delayjobs.E004"),
     ({"METRICS_HISTORY_HOURS": 2.5}, "django_delayjobs.E004")],
)  # fmt: skip
def test_bad_metrics_settings_are_check_errors(settings, value, check_id):
    settings.DELAYJOBS = {**settings.DELAYJOBS, **value}
    assert [e.id for e in check_settings()] == [check_id]


def test_good_metrics_settings_pass(settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "METRICS_TOKEN": TOKEN, "METRICS_HISTORY_HOURS": 48}
    assert check_settings() == []


@pytest.mark.parametrize("bad", [math.inf, math.nan, -math.inf])
def test_a_value_redis_cannot_add_is_not_observed(engine, bad):
    # HINCRBYFLOAT refuses inf and NaN: one such value would block every later flush.
    recorder = Recorder()
    recorder.record("q", Result(Outcome.SUCCEEDED, job(), duration=bad))
    recorder.flush(engine, [], now=T0.timestamp())
    totals = store.totals(engine, ["q"])["q"]
    assert totals["jobs:succeeded"] == 1
    assert "run:sum" not in totals and "lateness:sum" not in totals
