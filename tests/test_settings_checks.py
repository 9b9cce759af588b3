"""DELAYJOBS is validated by system checks; CACHE_ALIAS reuses a django-redis connection."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError

from django_delayjobs import schedule
from django_delayjobs.checks import check_settings, check_use_tz
from django_delayjobs.conf import DEFAULTS, NAMES, Settings, delayjobs_settings
from django_delayjobs.connection import get_engine
from tests.testapp import tasks


def ids(settings_dict, settings) -> list[str]:
    settings.DELAYJOBS = settings_dict
    return [error.id for error in check_settings()]


def test_valid_settings_pass(settings):
    assert ids({"REDIS_URL": "redis://x/0", "MAX_ATTEMPTS": 3}, settings) == []
    cluster = {"REDIS_CLUSTER": True, "REDIS_URL": "rediss://user:pw@node-1:7000/0",
               "QUEUE_SHARDS": {"orders": 6, "mail": 1, "bulk": 64}}  # fmt: skip
    assert ids(cluster, settings) == []
    assert ids({"MAX_RUN_SECONDS": None}, settings) == []  # no limit


def test_a_bad_shard_count_is_named_in_the_message(settings):
    settings.DELAYJOBS = {"QUEUE_SHARDS": {"orders": 65}}
    (error,) = check_settings()
    assert "orders" in error.msg and "from 1 to 64" in error.msg


def test_queue_shards_reach_the_engine(settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "QUEUE_SHARDS": {"orders": 6}}
    engine = get_engine()
    assert engine.shard_count("orders") == 6
    assert engine.shard_count("default") == 1
    assert not engine.is_cluster


def test_an_unreachable_cluster_is_a_clear_error(settings):
    from django_delayjobs.engine import EngineUnavailable

    settings.DELAYJOBS = {"REDIS_CLUSTER": True, "REDIS_URL": "redis://127.0.0.1:1/0"}
    with pytest.raises(EngineUnavailable, match=r"cannot reach a Redis Cluster at 127\.0\.0\.1:1"):
        get_engine()


def test_a_cluster_url_problem_never_shows_the_redis_password(settings):
    """check E013 (printed by ``manage.py check``, ``migrate``, every deploy) and the
    ImproperlyConfigured at run time name the URL without its user information."""
    from django.core.exceptions import ImproperlyConfigured

    secret = "hunter2-s3cret-pw"
    url = f"redis://:{secret}@redis.internal:6379/3"
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": url, "REDIS_CLUSTER": True}
    with pytest.raises(SystemCheckError) as raised:
        call_command("check")
    assert "E013" in str(raised.value)
    assert secret not in str(raised.value)
    assert "redis://***@redis.internal:6379/3" in str(raised.value)
    with pytest.raises(ImproperlyConfigured, match="database other than 0") as raised_at_run:
        get_engine()
    assert secret not in str(raised_at_run.value)


def test_cluster_mode_refuses_a_cache_that_is_not_a_cluster_client(settings, redis_url):
    from django.core.exceptions import ImproperlyConfigured

    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "jobs": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_url},
    }
    settings.DELAYJOBS = {"CACHE_ALIAS": "jobs", "REDIS_CLUSTER": True}
    with pytest.raises(ImproperlyConfigured, match=r"not a redis\.cluster\.RedisCluster"):
        get_engine()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"REDIS_ULR": "redis://x"}, "django_delayjobs.E002"),
        ({"LEASE_SECONDS": 0}, "django_delayjobs.E003"),
        ({"MAX_RUN_SECONDS": 0}, "django_delayjobs.E006"),
        ({"MAX_RUN_SECONDS": "60"}, "django_delayjobs.E006"),
        ({"MAX_RUN_SECONDS": float("inf")}, "django_delayjobs.E006"),
        ({"TICK_SECONDS": "1"}, "django_delayjobs.E003"),
        ({"TICK_SECONDS": 10**400}, "django_delayjobs.E003"),  # beyond a float: no OverflowError
        ({"LEASE_SECONDS": -(10**400)}, "django_delayjobs.E003"),
        ({"MAX_RUN_SECONDS": 10**400}, "django_delayjobs.E006"),  # optional: E006, as for inf
        ({"MAX_ATTEMPTS": 10**5000}, "django_delayjobs.E004"),  # an int with no repr
        ({"MAX_ATTEMPTS": 0}, "django_delayjobs.E004"),
        ({"BATCH_SIZE": 10_000}, "django_delayjobs.E004"),
        ({"PREFETCH": 0}, "django_delayjobs.E004"),
        ({"MAX_JSON_BYTES": 1023}, "django_delayjobs.E004"),
        ({"MAX_JSON_BYTES": 2**26 + 1}, "django_delayjobs.E004"),
        ({"MAX_JSON_BYTES": 4096.0}, "django_delayjobs.E004"),
        ({"PREFIX": "a:b"}, "django_delayjobs.E005"),
        ({"DEFAULT_QUEUE": ""}, "django_delayjobs.E005"),
        ({"REDIS_URL": 5}, "django_delayjobs.E006"),
        ({"CACHE_ALIAS": "nope"}, "django_delayjobs.E007"),
        ({"RECONCILE_SECONDS": 600, "RECONCILE_HORIZON_SECONDS": 60}, "django_delayjobs.W001"),
        ({"REDIS_CLUSTER": "yes"}, "django_delayjobs.E006"),
        ({"QUEUE_SHARDS": [("orders", 2)]}, "django_delayjobs.E012"),
        ({"QUEUE_SHARDS": {"orders": 0}}, "django_delayjobs.E012"),
        ({"QUEUE_SHARDS": {"orders": 65}}, "django_delayjobs.E012"),
        ({"QUEUE_SHARDS": {"orders": "6"}}, "django_delayjobs.E012"),
        ({"QUEUE_SHARDS": {"orders": True}}, "django_delayjobs.E012"),
        ({"QUEUE_SHARDS": {"a:b": 2}}, "django_delayjobs.E012"),
        ({"QUEUE_SHARDS": {1: 2}}, "django_delayjobs.E012"),
        ({"API_CALLBACK_QUEUES": ["a:b"]}, "django_delayjobs.E009"),
        ({"API_CALLBACK_QUEUES": []}, "django_delayjobs.E009"),
        ({"API_CALLBACK_QUEUES": "orders"}, "django_delayjobs.E009"),
        ({"REDIS_CLUSTER": True, "REDIS_URL": "unix:///tmp/r.sock"}, "django_delayjobs.E013"),
        ({"REDIS_CLUSTER": True, "REDIS_URL": "redis://node:7000/3"}, "django_delayjobs.E013"),
        ({"REDIS_CLUSTER": True, "REDIS_URL": "redis://node:port/0"}, "django_delayjobs.E013"),
    ],
)
def test_bad_settings_are_reported(settings, value, expected):
    assert expected in ids(value, settings)


@pytest.mark.django_db  # Django 6.1's `check` command reads the database
def test_unknown_setting_message_lists_known_names(settings):
    settings.DELAYJOBS = {"REDIS_ULR": "redis://x"}
    (error,) = check_settings()
    assert "unknown setting 'REDIS_ULR'" in error.msg
    assert "REDIS_URL" in error.hint
    with pytest.raises(SystemCheckError):
        call_command("check")


def test_settings_object_rejects_unknown_names():
    with pytest.raises(AttributeError, match="unknown DELAYJOBS setting"):
        delayjobs_settings.NOPE  # noqa: B018


@pytest.mark.django_db(transaction=True)
def test_cache_alias_reuses_the_django_redis_connection(settings, redis_url, redis_client):
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "jobs": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_url},
    }
    settings.DELAYJOBS = {"CACHE_ALIAS": "jobs", "PREFIX": "viacache"}
    from django_redis import get_redis_connection

    assert get_engine().client is get_redis_connection("jobs")
    job = schedule(tasks.record, in_=60, args=["x"])
    assert redis_client.zscore("{viacache:default}:pending", str(job.pk)) is not None


COMMANDS = [
    ("delayjobs_health",),
    ("delayjobs_stats",),
    ("delayjobs_reconcile",),
    ("run_delayworker", "--burst", "-v", "0"),
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: argv[0])
def test_a_cache_alias_that_is_not_django_redis_is_a_one_line_error(settings, argv):
    """``CACHE_ALIAS`` naming a cache that is not django-redis's (or a cache that does not
    match ``REDIS_CLUSTER``) passes ``manage.py check``, then connection.py raised Django's
    ImproperlyConfigured, which no command catches (they catch DelayJobsError): every
    command ended in a traceback, and the ``health/`` view in a 500."""
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    settings.DELAYJOBS = {**settings.DELAYJOBS, "CACHE_ALIAS": "default"}
    with pytest.raises(CommandError, match="is not a django-redis cache"):
        call_command(*argv)


def assert_views_say_settings_fail(client) -> None:
    """``health/`` and ``metrics/`` (to a staff session) answer 503 naming the settings;
    each used to be a 500 and a traceback per probe or scrape."""
    client.raise_request_exception = False
    response = client.get("/delayjobs/health/")
    assert response.status_code == 503
    assert response.json() == {"status": "fail", "checks": {"settings": "fail"}}
    admin = User.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(admin)
    response = client.get("/delayjobs/metrics/")
    assert response.status_code == 503
    assert b"settings cannot work" in response.content


@pytest.mark.django_db(transaction=True)
def test_health_and_metrics_views_say_settings_fail_for_a_cache_alias_that_is_not_django_redis(
    settings, client
):
    """It answered 500 (an ImproperlyConfigured it did not catch)."""
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    settings.DELAYJOBS = {**settings.DELAYJOBS, "CACHE_ALIAS": "default"}
    assert_views_say_settings_fail(client)


INVALID = {"MAX_ATTEMPTS": 0}  # out of range: a web process runs no system checks


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: argv[0])
def test_bad_settings_are_a_one_line_error_of_every_command(settings, argv):
    """delayjobs_health read DEFAULT_QUEUE before it caught bad settings: a traceback."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, **INVALID}
    with pytest.raises(CommandError, match="MAX_ATTEMPTS"):
        call_command(*argv)


@pytest.mark.django_db(transaction=True)
def test_health_and_metrics_views_say_settings_fail_for_invalid_settings(settings, client):
    """Both read a setting (DEFAULT_QUEUE, METRICS_TOKEN) before they caught bad settings:
    a 500 and a traceback per probe or scrape, where a CACHE_ALIAS gone wrong gave 503."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, **INVALID}
    assert_views_say_settings_fail(client)


@pytest.mark.parametrize("url", ["foo://localhost:6379/0", "localhost:6379", "redis://h:99999/0"])
def test_a_redis_url_redis_py_cannot_use_is_a_check_error(settings, url):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": url}
    assert [e.id for e in check_settings()] == ["django_delayjobs.E016"]


@pytest.mark.django_db(transaction=True)
def test_run_delayworker_refuses_such_a_redis_url_with_one_line(settings):
    """settings.md and worker.md: an invalid setting makes run_delayworker refuse to start
    with one line; redis-py's ValueError ended it in a traceback."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": "foo://localhost:6379/0"}
    with pytest.raises(CommandError, match="REDIS_URL"):
        call_command("run_delayworker", "--burst", "-v", "0")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: argv[0])
def test_a_cache_alias_not_in_caches_is_a_one_line_error(settings, argv):
    """Check E007 says so, but call_command and --skip-checks skip it: Django's
    InvalidCacheBackendError, which no command caught, ended each in a traceback."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "CACHE_ALIAS": "nope"}
    with pytest.raises(CommandError, match="nope"):
        call_command(*argv)


@pytest.mark.django_db(transaction=True)
def test_health_view_says_settings_fail_for_a_cache_alias_not_in_caches(settings, client):
    """A web process runs no system checks: it answered 500."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "CACHE_ALIAS": "nope"}
    client.raise_request_exception = False
    response = client.get("/delayjobs/health/")
    assert response.status_code == 503
    assert response.json() == {"status": "fail", "checks": {"settings": "fail"}}


def test_use_tz_false_is_refused_by_a_check_naming_the_setting(settings):
    """Due times are instants compared as aware datetimes: under ``USE_TZ = False`` the
    first ``schedule()`` would fail on a naive/aware comparison, so E015 says so first."""
    settings.USE_TZ = False
    (error,) = [e for e in check_use_tz() if e.id == "django_delayjobs.E015"]
    assert "USE_TZ" in error.msg
    settings.USE_TZ = True
    assert check_use_tz() == []


@pytest.mark.django_db(transaction=True)
def test_schedule_under_use_tz_false_raises_a_configuration_error(settings):
    """A WSGI server runs no system checks: ``schedule()`` itself names the setting (and
    the check) instead of a naive/aware ``TypeError``, and writes nothing."""
    from django_delayjobs.exceptions import ConfigurationError
    from django_delayjobs.models import Job

    settings.USE_TZ = False
    settings.TIME_ZONE = "America/Chicago"
    with pytest.raises(ConfigurationError, match=r"USE_TZ = True.*E015"):
        schedule(tasks.record, in_=60, args=["x"])
    assert not Job.objects.exists()


def _documented_settings() -> dict[str, tuple[str, str]]:
    """docs/settings.md's table: name -> (meaning, default as written)."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "settings.md").read_text()
    rows = re.findall(r"^\| `([A-Z_]+)` \| (.*) \| `(.*)` \|$", text, re.MULTILINE)
    return {name: (meaning, default) for name, meaning, default in rows}


def test_docs_settings_table_names_every_setting_with_its_default_and_range():
    """docs/settings.md lists each setting once, with the default and the bounds that
    conf.Settings (the one schema) gives it."""
    documented = _documented_settings()
    assert set(documented) == NAMES
    for name, (meaning, written) in documented.items():
        try:
            default = ast.literal_eval(written)
        except (ValueError, SyntaxError):
            default = written  # a bare URL
        assert default == DEFAULTS[name], name
        metadata = Settings.__dataclass_fields__[name].metadata
        low, high = metadata.get("low"), metadata.get("high")
        if low is not None:
            found = re.search(r"(\d[\d.]*) ?(?:-|to) ?(\d[\d.]*)", meaning)
            assert found is not None, name
            assert (float(found[1]), float(found[2])) == (low, high), name


def test_a_setting_read_while_another_thread_reloads_is_one_of_either_settings(settings):
    """A reload in one thread never makes a read in another raise: reload() once emptied
    every attribute, ``_current`` too, so a read between the two found no ``_current``
    ("unknown DELAYJOBS setting '_current'"). (That a read cannot keep a value of the
    settings a reload replaced rests on the lock; CPython gives no switch point between a
    read's check and its store to show it by.)"""
    import sys
    import threading

    settings.DELAYJOBS = {"LEASE_SECONDS": 300}
    errors: list[BaseException] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            try:
                assert delayjobs_settings.LEASE_SECONDS in (300, 200)
                delayjobs_settings.current()
            except BaseException as exc:  # any failure is the finding
                errors.append(exc)
                return

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    reader = threading.Thread(target=read)
    reader.start()
    try:
        for n in range(20_000):
            settings.DELAYJOBS = {"LEASE_SECONDS": 200 if n % 2 else 300}
    finally:
        done.set()
        reader.join()
        sys.setswitchinterval(interval)
    assert errors == []
    settings.DELAYJOBS = {"LEASE_SECONDS": 200}
    assert delayjobs_settings.LEASE_SECONDS == 200 == delayjobs_settings.current().LEASE_SECONDS
