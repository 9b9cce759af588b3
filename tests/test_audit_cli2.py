"""The management commands, round 2: option values an operator (or a template) gets wrong,
settings that cannot work, what a command does when stopped. Real servers only (the
suite's Redis, the test database); processes are stopped by pid."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse

from django_delayjobs.connection import get_engine

pytestmark = pytest.mark.django_db(transaction=True)

#: Numbers Python's int()/float() read but that no operator means: other scripts' digits,
#: digit group underscores, padding (a template's stray quote or space).
ODD_NUMBERS = ["\u0663", "1_0", " 3 ", "3\n", "\uff13", "0x10"]


@pytest.mark.parametrize("value", ODD_NUMBERS)
@pytest.mark.parametrize(("command", "option", "extra"), [
    ("run_delayworker", "--concurrency", ["--burst", "-v", "0"]),
    ("run_delayworker", "--tick", ["--burst", "-v", "0"]),
    ("delayjobs_prune", "--batch", ["--older-than", "30d"]),
    ("delayjobs_prune", "--max-rate", ["--older-than", "30d"]),
])  # fmt: skip
def test_numeric_options_take_ascii_digits_only(command, option, extra, value):
    """``--concurrency ٣`` started a worker of 3 threads, ``--batch 1_0`` pruned in batches
    of 10: whatever int()/float() read was taken, not refused as a mistake."""
    with pytest.raises(CommandError, match=option.removeprefix("--")):
        call_command(command, *extra, option, value)


@pytest.mark.parametrize("value", ODD_NUMBERS)
@pytest.mark.parametrize("option", ["--min-workers", "--max-garbage", "--max-overdue"])
def test_health_options_take_ascii_digits_only(option, value):
    with pytest.raises(CommandError) as raised:
        call_command("delayjobs_health", option, value)
    assert raised.value.returncode == 2
    assert raised.value.args[0].startswith(option)


@pytest.mark.parametrize("value", ODD_NUMBERS)
@pytest.mark.parametrize("name", ["min_workers", "max_garbage", "max_overdue"])
def test_the_health_view_takes_ascii_digits_only(name, value):
    response = Client().get(reverse("delayjobs_health"), {name: value})
    assert response.status_code == 400


@pytest.mark.parametrize(("command", "args"), [
    ("run_delayworker", ["--burst", "-v", "0", "--concurrency", "2", "--tick", "0.5"]),
    ("run_delayworker", ["--burst", "-v", "0", "--concurrency", "-0", "--tick", "1e-1"]),
    ("delayjobs_prune", ["--older-than", "30d", "--batch", "010", "--max-rate", "0"]),
    ("delayjobs_prune", ["--older-than", "30d", "--batch", "0" * 40 + "10"]),
])  # fmt: skip
def test_plain_numbers_are_still_taken(command, args):
    if "-0" in args:  # 0 is out of range: refused for its range, not its spelling
        with pytest.raises(CommandError, match="must be from 1"):
            call_command(command, *args)
        return
    call_command(command, *args)


def stats(*names: str) -> tuple[int, list[str]]:
    out = io.StringIO()
    try:
        call_command("delayjobs_stats", *names, stdout=out)
        code = 0
    except CommandError as exc:
        code, out = exc.returncode, io.StringIO(out.getvalue() + f"ERROR {exc}\n")
    return code, out.getvalue().splitlines()


def test_stats_says_a_queue_or_shard_redis_never_held_is_unknown(settings):
    """``delayjobs_stats ordres`` (a typo), or a shard of a count the queue never had,
    printed a row of zeros and exit 0: "no job waiting" to an operator who had mistyped."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "QUEUE_SHARDS": {"orders": 2}}
    get_engine().add("orders", {"a": 10**13, "b": 10**13})
    code, lines = stats("orders", "ordres", "orders#1/3")
    assert code == 1
    assert [line.split()[0] for line in lines[1:-1]] == ["orders", "orders#0/2", "orders#1/2"]
    assert "ordres" in lines[-1] and "orders#1/3" in lines[-1] and "unknown" in lines[-1]


def test_stats_shows_a_configured_or_served_queue_that_never_held_a_job(settings):
    """Zeros are the truth for the default queue, a queue of QUEUE_SHARDS, and a queue a
    worker serves: those are not refused as unknown."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "QUEUE_SHARDS": {"big": 2},
                          "API_CALLBACK_QUEUES": ["hooks"]}  # fmt: skip
    engine = get_engine()
    engine.heartbeat("served", "w1", ttl_ms=60_000)
    code, lines = stats("default", "big", "big#1/2", "served", "hooks")
    assert code == 0, lines
    rows = [line.split()[0] for line in lines[1:]]
    assert rows == ["default", "big", "big#0/2", "big#1/2", "big#1/2", "served", "hooks"]


def test_stats_of_named_queues_still_shows_them_when_the_directory_is_another_type(
    redis_client,
):
    """The directory of queues overwritten by another program: the queues named are
    shown (none is called unknown: the directory cannot say), and the key is named."""
    engine = get_engine()
    engine.add("orders", {"a": 10**13})
    redis_client.delete(engine.queues_key)
    redis_client.set(engine.queues_key, "x")
    code, lines = stats("orders", "ordres")
    assert code == 1
    assert [line.split()[0] for line in lines[1:-1]] == ["orders", "ordres"]
    assert "not a set" in lines[-1] and "unknown" not in lines[-1]


#: REDIS_URL query values redis-py parses but cannot use: each crashed the worker with a
#: traceback (ValueError, OverflowError at the first connect) or went elsewhere in silence.
BAD_URL_VALUES = ["socket_timeout=nan", "socket_timeout=-1", "socket_timeout=1e400",
                  "socket_timeout=0", "socket_connect_timeout=nan", "max_connections=-5",
                  "timeout=inf", "protocol=9", "db=-1", "sockettimeout=1"]  # fmt: skip


@pytest.mark.parametrize("query", BAD_URL_VALUES)
def test_a_redis_url_value_redis_py_cannot_use_is_a_check_error_not_a_traceback(
    settings, redis_url, query
):
    from django_delayjobs.checks import check_settings
    from django_delayjobs.connection import reset_engine

    url = redis_url + ("&" if "?" in redis_url else "?") + query
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": url}
    errors = check_settings()
    assert [e.id for e in errors] == ["django_delayjobs.E016"]
    name = query.split("=")[0]
    assert {"db": "database"}.get(name, name) in errors[0].msg
    reset_engine()
    try:
        with pytest.raises(CommandError, match="REDIS_URL"):
            call_command("run_delayworker", "--burst", "-v", "0", "--skip-checks")
    finally:
        reset_engine()


@pytest.mark.parametrize("url", [
    "redis://redis.internal:0", "redis://redis.internal/1x", "redis://redis.internal/db1",
    "rediss://r.internal/-1", "redis://redis.internal/1?db=2",
])  # fmt: skip
def test_a_redis_url_that_redis_py_would_send_to_port_6379_or_database_0_is_refused(settings, url):
    """Port 0 and a database path that is not a number were dropped by redis-py without a
    word: the worker went to port 6379, database 0 (another application's, perhaps)."""
    from django_delayjobs.checks import check_settings

    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": url}
    assert [e.id for e in check_settings()] == ["django_delayjobs.E016"]


def test_a_ca_bundle_path_with_a_nul_character_is_a_check_error_not_a_crash(settings):
    """``HTTP_CA_BUNDLE = "ca\\x00.pem"`` made ``manage.py check`` itself fail with a
    traceback (ValueError: embedded null byte), hiding every other check's message."""
    from django_delayjobs.checks import check_settings

    settings.DELAYJOBS = {**settings.DELAYJOBS, "HTTP_CA_BUNDLE": "ca\x00.pem"}
    assert [e.id for e in check_settings()] == ["django_delayjobs.E009"]


@pytest.mark.parametrize(
    "entry", ["os.system", "builtins.object", "django.contrib.auth.models.User"]
)
def test_api_permission_classes_that_are_no_permission_class_are_a_check_error(settings, entry):
    """A callable that is no permission class passed check E008: then every API request
    answered 500 (``os.system()`` without its argument, an ``object`` without
    ``has_permission``)."""
    from django_delayjobs.checks import check_settings

    settings.DELAYJOBS = {**settings.DELAYJOBS, "API_PERMISSION_CLASSES": [entry]}
    errors = check_settings()
    assert [e.id for e in errors] == ["django_delayjobs.E008"]
    assert entry in errors[0].msg


def test_api_permission_classes_and_their_combinations_still_pass(settings):
    from rest_framework.permissions import IsAdminUser, IsAuthenticated

    from django_delayjobs.checks import check_settings

    value = ["rest_framework.permissions.IsAuthenticated", IsAuthenticated & IsAdminUser,
             ~IsAdminUser]  # fmt: skip
    settings.DELAYJOBS = {**settings.DELAYJOBS, "API_PERMISSION_CLASSES": value}
    assert check_settings() == []


@pytest.mark.parametrize("args", [
    ["run_delayworker", "--concurrency", "0"], ["run_delayworker", "--tick", "0"],
    ["run_delayworker", "--metrics-port", "70000"], ["run_delayworker", "--burst", "--worker-only",
                                                    "--tick", "61"],
    ["delayjobs_prune", "--older-than", "0d"], ["delayjobs_prune", "--older-than", "1d",
                                                "--status", "running"],
    ["delayjobs_prune", "--older-than", "1d", "--batch", "0"],
    ["delayjobs_prune", "--older-than", "1d", "--max-rate", "-1"],
    ["delayjobs_stats", "a b"], ["delayjobs_stats", "q#2/2"],
])  # fmt: skip
def test_a_bad_option_value_exits_2_as_argparse_does(args):
    """``--concurrency x`` exited 2 (argparse) but ``--concurrency 0`` 1, the code of a
    worker or prune that failed: a timer or a script could not tell a typo in its unit
    from a database that was down. Every bad option value exits 2 now, as in
    ``delayjobs_health``."""
    with pytest.raises(CommandError) as raised:
        call_command(*args)
    assert raised.value.returncode == 2


@pytest.mark.parametrize("url", [
    "redis://node.internal:7000?socket_timeout=nan", "redis://node.internal:0",
    "redis://node.internal:7000?db=x",
])  # fmt: skip
def test_a_cluster_url_redis_py_cannot_use_is_a_check_error_too(settings, url):
    """With REDIS_CLUSTER, check E013 looked at the scheme, host and database only: a
    socket timeout of nan passed, and the worker said it "cannot reach" the Cluster."""
    from django_delayjobs.checks import check_settings

    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": url, "REDIS_CLUSTER": True}
    assert [e.id for e in check_settings()] == ["django_delayjobs.E013"]
