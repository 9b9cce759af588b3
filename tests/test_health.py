"""``delayjobs_health`` and the ``health/`` view, against a real Redis (and a stopped one)."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from datetime import timedelta
from io import StringIO

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from django_delayjobs.connection import get_engine, reset_engine
from django_delayjobs.embedded import EmbeddedRedis, find_redis_server
from django_delayjobs.embedded_cluster import free_base_port
from django_delayjobs.models import Job
from tests.helpers import set_read_only, wait_for
from tests.test_retention import database_down

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/delayjobs/health/"


def beat(queue: str = "default", worker: str = "w1") -> None:
    """What a running worker does every HEARTBEAT_SECONDS."""
    get_engine().heartbeat(queue, worker, 30_000, {"host": "test"})


def overdue(queue: str = "default", seconds: float = 120) -> str:
    """A job due ``seconds`` ago that no worker has started."""
    run_at = timezone.now() - timedelta(seconds=seconds)
    job = Job.objects.create(queue=queue, action="tests.nothing", run_at=run_at)
    get_engine().add(queue, {str(job.pk): int(run_at.timestamp() * 1000)})
    return str(job.pk)


def health(*args: str) -> tuple[int, list[str]]:
    out = StringIO()
    try:
        call_command("delayjobs_health", *args, stdout=out)
        code = 0
    except CommandError as exc:
        code = exc.returncode
        if code == 2:
            raise
    return code, out.getvalue().splitlines()


def names(lines: list[str], mark: str) -> list[str]:
    return [line.split()[1] for line in lines if line.startswith(mark)]


@pytest.fixture
def stopped_redis():
    """Settings pointing at a Redis that was started, then stopped by pid."""
    from django.conf import settings

    server = EmbeddedRedis()
    server.start()
    url = server.url
    server.close()
    with override_settings(DELAYJOBS={**settings.DELAYJOBS, "REDIS_URL": url}):
        yield url


@pytest.fixture
def private_redis():
    """Settings pointing at a Redis of this test's own, and a client of it."""
    from django.conf import settings

    server = EmbeddedRedis()
    server.start()
    try:
        with override_settings(DELAYJOBS={**settings.DELAYJOBS, "REDIS_URL": server.url}):
            beat()
            yield redis.Redis.from_url(server.url)
    finally:
        server.close()


# -- the command ---------------------------------------------------------------------------


def test_all_well_exits_0():
    beat()
    code, lines = health()
    assert code == 0
    assert names(lines, "ok") == ["redis", "database", "workers:default", "overdue:default"]


def test_no_live_worker_fails():
    code, lines = health()
    assert code == 1
    assert names(lines, "FAIL") == ["workers:default"]
    assert "0 live worker process(es), at least 1 wanted" in lines[2]


def test_overdue_job_fails_only_past_the_limit():
    beat()
    overdue(seconds=120)
    code, lines = health("--max-overdue", "60")
    assert code == 1 and names(lines, "FAIL") == ["overdue:default"]
    assert health("--max-overdue", "600")[0] == 0


def test_garbage_is_checked_when_a_limit_is_given():
    beat("orders")
    engine = get_engine()
    dead = [str(uuid.uuid4()) for _ in range(3)]
    engine.add("orders", dict.fromkeys(dead, 0))
    engine.promote("orders")
    assert engine.claim("orders", 3) == dead
    engine.bury("orders", dead)
    assert health("--queues", "orders")[0] == 0  # not checked by default
    code, lines = health("--queues", "orders", "--max-garbage", "2")
    assert code == 1 and names(lines, "FAIL") == ["garbage:orders"]
    assert "3 dead job(s) in the garbage, at most 2 allowed" in lines[-1]
    assert health("--queues", "orders", "--max-garbage", "3")[0] == 0


def test_several_queues_and_workers():
    beat("a", "w1"), beat("a", "w2"), beat("b", "w1")
    code, lines = health("--queues", "a,b", "--min-workers", "2")
    assert code == 1 and names(lines, "FAIL") == ["workers:b"]
    assert health("--queues", "a,b", "--min-workers", "0")[0] == 0


def test_redis_down_fails_every_redis_check(stopped_redis):
    code, lines = health("--queues", "a,b")
    assert code == 1
    assert names(lines, "ok") == ["database"]
    assert names(lines, "FAIL") == ["redis", "workers:a", "overdue:a", "workers:b", "overdue:b"]


def test_a_full_redis_fails_but_the_queues_are_still_checked(private_redis):
    """At maxmemory with noeviction Redis still answers, yet refuses every new job."""
    private_redis.config_set("maxmemory-policy", "noeviction")
    private_redis.config_set("maxmemory", 1)
    code, lines = health()
    assert code == 1 and names(lines, "FAIL") == ["redis"]
    assert "full: used_memory" in lines[0] and "noeviction" in lines[0]
    assert names(lines, "ok") == ["database", "workers:default", "overdue:default"]
    private_redis.config_set("maxmemory", 0)
    assert health()[0] == 0


def test_a_replica_fails(private_redis):
    private_redis.replicaof("127.0.0.1", 1)  # a master that never answers: still a replica
    try:
        code, lines = health()
    finally:
        private_redis.replicaof("NO", "ONE")
    assert code == 1 and names(lines, "FAIL") == ["redis"]
    assert "refuses writes: it is a replica" in lines[0]


def test_a_redis_short_of_replicas_to_write_fails(private_redis):
    """With ``min-replicas-to-write`` and fewer good replicas Redis refuses every write
    (NOREPLICAS) while it answers INFO and PING: the check asks it to write."""
    beat()
    private_redis.config_set("min-replicas-to-write", 1)
    try:
        code, lines = health()
    finally:
        private_redis.config_set("min-replicas-to-write", 0)
    assert code == 1 and names(lines, "FAIL") == ["redis"], lines
    assert "refuses writes: Redis refused the command: NOREPLICAS" in lines[0]
    assert health()[0] == 0


def test_a_redis_that_cannot_persist_fails(tmp_path, settings):
    """A Redis whose last RDB save failed (disk full, its directory gone) refuses every
    write with MISCONF, yet INFO reads as usual: on a connection in use (redis-py PINGs
    only one idle for 30 s: the view of a web process probed every few seconds) the check
    said ok. It PINGs, which such a Redis refuses too."""
    data = tmp_path / "data"
    data.mkdir()
    sock = tmp_path / "redis.sock"
    process = subprocess.Popen(
        [find_redis_server(), "--port", "0", "--unixsocket", str(sock), "--dir", str(data),
         "--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction",
         "--logfile", str(tmp_path / "redis.log")],
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        client = redis.Redis(unix_socket_path=str(sock))
        wait_for(lambda: sock.exists() and client.ping())
        settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": f"unix://{sock}"}
        assert health("--min-workers", "0")[0] == 0  # and the connection is in use
        client.config_set("save", "3600 1")  # saves are on: a failed one stops writes
        shutil.rmtree(data)  # the save cannot create its file
        client.bgsave()
        wait_for(lambda: client.info("persistence")["rdb_last_bgsave_status"] == "err")
        with pytest.raises(redis.ResponseError, match="MISCONF"):
            client.set("probe", 1)
        code, lines = health("--min-workers", "0")
        reset_engine()  # a new connection: redis-py PINGs it before the INFO
        fresh = health("--min-workers", "0")[1]
    finally:
        process.kill()  # SIGTERM would save first, fail and not exit
        process.wait(5)
    assert code == 1 and names(lines, "FAIL")[0] == "redis", lines
    assert "refuses writes: Redis refused the command: MISCONF" in lines[0]
    # It answered, if with an error: the queue checks still run (they only read).
    assert names(fresh, "FAIL")[0] == "redis" and "MISCONF" in fresh[0], fresh
    assert "0 live worker process(es)" in fresh[2], fresh


def test_database_down_fails(tmp_path):
    beat()
    with database_down(tmp_path):
        code, lines = health()
    assert code == 1 and names(lines, "FAIL") == ["database"]


def test_a_database_without_the_apps_migrations_fails():
    """Migrations not applied (a new version started before ``migrate``): schedule() and
    every claim fail, yet ``SELECT 'off'`` answered and the web's probe passed."""
    beat()
    call_command("migrate", "django_delayjobs", "0002", verbosity=0)
    try:
        code, lines = health()
    finally:  # every app: going back unapplied testapp's migrations that depend on ours
        call_command("migrate", verbosity=0)
    assert code == 1 and names(lines, "FAIL") == ["database"]
    assert "cannot read the job table (are the migrations applied? manage.py migrate)" in lines[1]
    assert health()[0] == 0


@pytest.mark.skipif("os.environ.get('DATABASE_URL') is None",
                    reason="a read-only database (PostgreSQL)")  # fmt: skip
def test_a_database_that_refuses_writes_fails():
    """A standby answers SELECT 1, yet refuses every claim: not healthy."""
    beat()
    set_read_only(True)
    try:
        connection.close()  # the next session is a read-only one
        code, lines = health()
    finally:
        set_read_only(False)
    assert code == 1 and names(lines, "FAIL") == ["database"]
    assert "refuses writes" in next(line for line in lines if " database " in line)
    connection.close()
    assert health()[0] == 0


@pytest.mark.parametrize("args", [
    ["--queues", ""], ["--queues", "a b"], ["--queues", "x" * 65], ["--queues", ",".join(
        f"q{n}" for n in range(101))],
    ["--max-overdue", "abc"], ["--max-overdue=-1"], ["--max-overdue", "nan"],
    ["--max-overdue", "inf"], ["--max-overdue", "1e400"],
    ["--min-workers", "1.5"], ["--min-workers=-1"], ["--min-workers", "9" * 30],
    ["--max-garbage", "x"], ["--max-garbage", "1" * 20],
])  # fmt: skip
def test_bad_options_exit_2(args):
    with pytest.raises(CommandError) as raised:
        health(*args)
    assert raised.value.returncode == 2
    assert raised.value.args[0].startswith(args[0].split("=")[0])


# -- the view ------------------------------------------------------------------------------


def test_view_200_when_healthy_without_login(client):
    beat()
    response = client.get(URL)
    assert response.status_code == 200
    checks = {"redis": "ok", "database": "ok", "workers:default": "ok", "overdue:default": "ok"}
    assert response.json() == {"status": "ok", "checks": checks}
    assert "no-cache" in response["Cache-Control"]


def test_view_503_says_which_check_failed_and_nothing_else(client):
    beat()
    job = overdue(seconds=3600)
    response = client.get(URL)
    assert response.status_code == 503
    assert response.json()["checks"]["overdue:default"] == "fail"
    assert job not in response.content.decode() and "3600" not in response.content.decode()


def test_view_query_parameters(client):
    beat("a")
    assert client.get(URL, {"queues": "a"}).status_code == 200
    assert client.get(URL, {"queues": "a,b"}).status_code == 503
    assert client.get(URL, {"queues": "a,b", "min_workers": "0"}).status_code == 200


def test_an_anonymous_request_for_many_queues_logs_one_line(client, caplog):
    queues = ",".join(f"q{n}" for n in range(100))  # none has a worker
    with caplog.at_level("WARNING", logger="django_delayjobs.health"):
        assert client.get(URL, {"queues": queues}).status_code == 503
    [line] = [r.getMessage() for r in caplog.records if r.name == "django_delayjobs.health"]
    assert line.startswith("health: 100 failed: workers:q0 (0 live worker")


@pytest.mark.parametrize("query", [
    {"queues": ""}, {"queues": "<script>"}, {"max_overdue": "-1"}, {"max_overdue": "nan"},
    {"min_workers": "x"}, {"max_garbage": "1" * 40}, {"other": "1"},
])  # fmt: skip
def test_view_bad_query_is_400(client, query):
    response = client.get(URL, query)
    assert response.status_code == 400
    assert response.json()["error"].startswith("bad query")


def test_view_redis_down_is_503_without_details(client, stopped_redis):
    response = client.get(URL)
    assert response.status_code == 503
    body = response.content.decode()
    assert json.loads(body)["checks"]["redis"] == "fail"
    assert stopped_redis.split("://")[1] not in body  # no socket path, no URL


@pytest.fixture
def unreachable_cluster():
    """Settings naming a Redis Cluster whose seed node does not answer: the client cannot
    even be made (it reads the slot table from the seed when it is made)."""
    from django.conf import settings

    url = f"redis://127.0.0.1:{free_base_port(1)}/0"
    dj = {**settings.DELAYJOBS, "REDIS_URL": url, "REDIS_CLUSTER": True}
    with override_settings(DELAYJOBS=dj):
        yield url


def test_an_unreachable_cluster_fails_the_redis_checks_it_is_no_bad_option(unreachable_cluster):
    code, lines = health("--queues", "a")  # exit 2 (a bad option) raises here
    assert code == 1
    assert names(lines, "FAIL") == ["redis", "workers:a", "overdue:a"], lines
    assert "unavailable: cannot reach a Redis Cluster at 127.0.0.1:" in lines[0]


def test_the_view_says_an_unreachable_cluster_is_redis_not_the_settings(
    client, unreachable_cluster
):
    response = client.get(URL)
    assert response.status_code == 503
    assert json.loads(response.content)["checks"] == {
        "redis": "fail",
        "database": "ok",
        "workers:default": "fail",
        "overdue:default": "fail",
    }


def test_view_database_down_is_503(client, tmp_path):
    beat()
    with database_down(tmp_path):
        response = client.get(URL)
    assert response.status_code == 503
    assert response.json()["checks"]["database"] == "fail"


def test_view_refuses_post_and_answers_head(client):
    beat()
    assert client.post(URL).status_code == 405
    assert client.head(URL).status_code == 200
