"""Audit of the embedded Redis, the embedded Cluster and the example shop."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import redis

from django_delayjobs.embedded import EmbeddedRedis, find_redis_server, start_server
from django_delayjobs.embedded_cluster import EmbeddedCluster, _port_free, free_base_port
from tests.helpers import ROOT, wait_for

MANAGE = ROOT / "example_project" / "manage.py"


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


def test_an_embedded_redis_that_exits_before_writing_its_log_releases_its_directory(tmp_path):
    """A redis-server that exited (or a start that timed out) before the server had written
    its log: ``start()`` raised the error of reading that log for its message
    (FileNotFoundError, IsADirectoryError) instead of saying the server did not start, and
    skipped ``stop()``: the directory stayed locked, refused to every later start."""
    directory = tmp_path / "redis"
    (directory / "redis.log").mkdir(parents=True)  # redis-server cannot open its log
    server = EmbeddedRedis(directory)
    with pytest.raises(RuntimeError, match="did not start"):
        server.start()
    assert server.process is None
    (directory / "redis.log").rmdir()
    again = EmbeddedRedis(directory)  # the directory is free again
    try:
        assert served_by(again.start()) == again.pid
    finally:
        again.close()


class NeverAnswers(EmbeddedRedis):
    """A redis-server that runs but does not answer in time (a loaded machine, say)."""

    def _answers(self) -> bool:
        return False

    def start(self, timeout: float = 0.2) -> str:  # as ``with`` calls it
        return super().start(timeout)


def test_an_embedded_redis_that_fails_to_start_in_a_with_block_leaves_nothing(
    tmp_path, monkeypatch
):
    """``with EmbeddedRedis() as server:`` whose start failed left its temporary directory
    (with the server's log) in /tmp, ``__exit__`` not running when ``__enter__`` raises;
    and a start that timed out before the server wrote its log left that server running."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    server = NeverAnswers()
    with pytest.raises(RuntimeError, match="did not start"), server:
        pass
    assert server.process is None
    assert os.listdir(tmp_path) == []


# -- EmbeddedCluster -----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_embedded_cluster_starts_again_after_stop():
    """``stop()`` then ``start()`` (the class says both may be called) failed: the new nodes
    got the same ports and directories, loaded the old nodes' ``nodes.conf`` and refused to
    form a new cluster ("Slot 0 is already busy"); the failed start then deleted the whole
    directory."""
    cluster = EmbeddedCluster(masters=1, replicas=0)
    try:
        cluster.start(timeout=30)
        cluster.stop()
        url = cluster.start(timeout=30)
        with redis.Redis.from_url(url) as client:
            assert client.execute_command("CLUSTER INFO")  # answers as a cluster node
        assert len(cluster.master_nodes()) == 1
    finally:
        cluster.close()


# -- the example shop ----------------------------------------------------------------------

SHOP_PROGRAM = """
from django.core.management import call_command
from django.test import Client
from shop.models import Order
call_command("migrate", verbosity=0)
client = Client(HTTP_HOST="localhost", raise_request_exception=False)
print(client.post("/orders/", {"amount": "19.90"}).status_code)
order = Order.objects.get()
print(order.auto_cancel_key, Order.objects.count())
"""


def shop(env: dict[str, str], program: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(MANAGE), "shell", "-c", program],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.fixture
def shop_env(tmp_path: Path, redis_url: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")
    }
    return {**env, "SHOP_SQLITE_PATH": str(tmp_path / "shop.sqlite3"), "REDIS_URL": redis_url}


@pytest.mark.slow
def test_the_shop_places_an_order_due_at_once(shop_env):
    """``SHOP_AUTO_CANCEL_SECONDS=0`` (or an order placed with a deadline already passed):
    the payment reminder, due halfway to a deadline that had passed by the time it was
    scheduled, expired before it was due; ``schedule_http`` refused it and every "Create
    an order" answered 500."""
    done = shop({**shop_env, "SHOP_AUTO_CANCEL_SECONDS": "0"}, SHOP_PROGRAM)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-2:] == ["302", "order-1-autocancel 1"], done.stderr[-3000:]


@pytest.mark.slow
def test_the_shop_refuses_an_auto_cancel_delay_no_order_can_have(shop_env):
    """``SHOP_AUTO_CANCEL_SECONDS=-5`` (or ``nan``) started the shop, then every "Create an
    order" answered 500 (``schedule()`` refusing the delay); now the settings say so."""
    done = shop({**shop_env, "SHOP_AUTO_CANCEL_SECONDS": "-5"}, SHOP_PROGRAM)
    assert done.returncode != 0
    assert "SHOP_AUTO_CANCEL_SECONDS must be a number of seconds" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "option", "value"),
    [
        ("demo", "--deadline", "inf"),
        ("demo", "--deadline", "1e300"),
        ("demo", "--arrivals", "nan"),
        ("race", "--lead", "nan"),
        ("race", "--spread", "-inf"),
    ],
)
def test_demo_and_race_refuse_a_delay_they_cannot_use(shop_env, tmp_path, command, option, value):
    """``demo --deadline inf`` (or ``1e300``) and ``race --lead nan`` were accepted: the
    command migrated, started a redis-server and its workers, then died placing the first
    order with a traceback (``InvalidSchedule``, ``ValueError: cannot convert float NaN``)."""
    env = {k: v for k, v in shop_env.items() if k != "REDIS_URL"}  # would start its own
    log = tmp_path / "worker.log"
    done = subprocess.run(
        [sys.executable, str(MANAGE), command, f"{option}={value}", "--orders", "2",
         "--worker-log", str(log)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"argument {option}: invalid" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not log.exists()  # no worker was started


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_embedded_cluster_node_does_not_take_another_server_for_itself():
    """A node whose port another server took meanwhile (a restart after a kill, a port
    found free and taken before the node bound it): its redis-server exited ("Address
    already in use"), but the other server's PONG counted as the node answering, so the
    cluster was formed with, or waited for health from, a server that was not its own."""
    cluster = EmbeddedCluster(masters=1, replicas=0)
    foreign = None
    try:
        cluster.start(timeout=30)
        node = cluster.nodes[0]
        cluster.kill(node)
        foreign = start_server([find_redis_server(), "--port", str(node.port), "--bind",
                                "127.0.0.1", "--save", ""])  # fmt: skip
        with redis.Redis(port=node.port) as client:
            wait_for(lambda: _pings(client))
        started = time.monotonic()
        with pytest.raises(RuntimeError, match=rf"{node.address}.*(exited|pid {foreign.pid})"):
            cluster.restart(node, timeout=10)
        assert time.monotonic() - started < 5
    finally:
        cluster.close()
        if foreign is not None:
            foreign.terminate()
            foreign.wait(10)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def test_free_base_port_looks_below_its_starting_point():
    """The search for free ports began at a pid-dependent port and went up only: with the
    ports from there to the top taken, it gave up ("no 1 free ports") with every port below
    its start free. Here every port of a small range is taken but its first."""
    span = next(n for n in range(3, 40) if (os.getpid() * 7) % (n - 1))
    for low in range(40000, 45000, 50):
        if all(_port_free(p) and _port_free(p + 10000) for p in range(low, low + span)):
            break
    taken = []
    try:
        for port in range(low + 1, low + span):
            sock = socket.socket()
            taken.append(sock)
            sock.bind(("127.0.0.1", port))
        assert free_base_port(1, low, low + span) == low
    finally:
        for sock in taken:
            sock.close()


def test_an_embedded_redis_in_a_relative_directory(tmp_path, monkeypatch):
    """``EmbeddedRedis("var/redis")`` never started: redis-server changes to its ``--dir``
    first, then looked for its log (and would have put its socket) at the relative path
    again below it; and the relative ``unix://var/...`` URL names another path."""
    monkeypatch.chdir(tmp_path)
    with EmbeddedRedis("var/redis") as server:
        assert server.url == f"unix://{tmp_path}/var/redis/redis.sock"
        assert served_by(server.url) == server.pid


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_embedded_cluster_in_a_relative_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with EmbeddedCluster(masters=1, replicas=0, directory=Path("cluster")) as cluster:
        assert len(cluster.master_nodes()) == 1
        assert cluster.nodes[0].directory.is_absolute()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_embedded_cluster_deletes_only_what_it_made(tmp_path):
    """``close()`` (also called by a failed ``start()``) deleted the whole ``directory`` it
    was given, with whatever else was in it; as ``EmbeddedRedis`` does, it now deletes
    only what it made: the nodes' directories, and a temporary directory of its own."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine")
    with EmbeddedCluster(masters=1, replicas=0, directory=mine) as cluster:
        made = cluster.nodes[0].directory
        assert made.is_dir()
    assert sorted(os.listdir(mine)) == ["keep.txt"]
    own = EmbeddedCluster(masters=1, replicas=0)
    with own:
        pass
    assert not own.directory.exists()


@pytest.mark.slow
def test_the_shop_without_debug_refuses_the_secrets_published_in_its_source(shop_env):
    """With ``SHOP_DEBUG=0`` (the deploy/ files' setting) the shop ran on the demo
    ``SECRET_KEY`` and the demo webhook secret, both in its source: anyone could sign
    sessions, or forge the payment reminders its endpoint accepts as its own."""

    def check(**extra: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in shop_env.items() if not k.startswith("SHOP_") or k.endswith("PATH")}
        return subprocess.run(
            [sys.executable, str(MANAGE), "check"], env={**env, "SHOP_DEBUG": "0", **extra},
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    done = check()
    assert done.returncode != 0 and "SHOP_SECRET_KEY must be set" in done.stderr, done.stderr
    done = check(SHOP_SECRET_KEY="s" * 50)
    assert done.returncode != 0 and "SHOP_WEBHOOK_SECRET must be set" in done.stderr
    secret = "whsec_" + base64.b64encode(b"a secret of this deployment!").decode()
    done = check(SHOP_SECRET_KEY="s" * 50, SHOP_WEBHOOK_SECRET=secret)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.timeout(180)
def test_the_demo_stops_when_its_redis_server_dies(shop_env, tmp_path):
    """The demo's private redis-server killed (an OOM kill, say): the demo went on showing
    its progress line, its workers retrying a socket that was gone, until its time-out a
    minute after the last deadline (two minutes with ``--deadline 60``), and only then
    said it timed out, without a word about Redis."""
    from tests.test_example import demo_processes, kill_all, start_demo, wait_gone

    env = {k: v for k, v in shop_env.items() if k != "REDIS_URL"}  # it starts its own
    demo, out = start_demo(env, tmp_path)
    pids: list[int] = []
    directory = None
    try:
        directory = demo_processes(out, pids)
        out.wait_for(r"orders:\s+\d+ pending", 60)  # waiting for the outcomes
        os.kill(pids[0], signal.SIGKILL)  # the redis-server, a child of the demo
        assert demo.wait(30) == 1, out.text
        out.thread.join(10)
        assert "the private redis-server exited (code -9)" in out.text, out.text
        assert wait_gone(pids[1:], 10) == [], out.text  # its workers were stopped
    finally:
        kill_all(pids)
        out.close(demo)
        if directory is not None:  # left if the demo had to be killed
            shutil.rmtree(directory, ignore_errors=True)
