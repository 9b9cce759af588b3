"""Blocking waits on token lists (``wake``, ``notify``), on one Redis or on a Cluster.

One Redis: a single ``BLPOP`` over every list a caller waits on, as always.

A Cluster refuses a ``BLPOP`` whose keys lie in different slots, and the lists of different
queues (or shards) do. So a process keeps one *doorbell* per list: a thread that holds a
single-key ``BLPOP`` on that list while at least one of the process's threads waits on it,
and hands each token it pops to exactly one of them (or pushes it back when none is left,
so another process gets it). Redis holds a blocked client at no cost, so an idle process
costs one ``BLPOP`` per list per second, and a token wakes a waiter within a round trip.

A client whose socket timeout is too short to hold any ``BLPOP`` polls instead, on one
Redis or a Cluster (``Polling``).
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from redis.exceptions import MovedError, RedisError, ResponseError
from redis.exceptions import TimeoutError as ReadTimeout

from .validation import brief, finite

#: A doorbell's ``BLPOP`` lasts at most this long, so a doorbell nobody waits on any more
#: ends within a second.
BELL_BLOCK = 1.0
#: How late Redis may answer a blocking pop that timed out: on its next tick (100 ms at
#: ``hz 10``), plus a margin. A client whose socket timeout leaves less than this beside
#: any wait (under 0.16 s) polls the token lists instead of blocking on them (one Redis
#: and Cluster alike).
HZ_SLACK = 0.12
#: How often a client that polls (see ``HZ_SLACK``) looks at the token lists (seconds).
POLL_EVERY = 0.025
#: The shortest wait on a Cluster. Redis answers a timed-out ``BLPOP`` only on its next
#: tick (100 ms at ``hz 10``), so a single Redis never waits less either; a shorter wait
#: would return before a newly started doorbell had popped a token already there.
MIN_CLUSTER_WAIT = 0.1
#: The shortest ``BLPOP`` timeout sent. Redis before 7.0.8 (6.2 included) reads a timeout
#: of 0.001 s as 0 ms, and 0 as no timeout at all (redis/redis#11687): a sliver of a wait
#: would block until the socket timeout, or with none until a token came. A timed-out pop
#: is answered on Redis's next tick anyway, so a longer floor costs a short wait nothing.
MIN_BLOCK = 0.01
#: The longest ``BLPOP`` timeout sent on a client with no socket timeout (a wait that long
#: returns no token, and its caller waits again): Redis refuses a timeout past about
#: 9.2e15 s, which a caller's absurd wait would otherwise send.
MAX_BLOCK = 3600.0
#: How many MOVED in a row a doorbell follows (each time reading the slot table anew)
#: before its waiters hear of it: a table still out of date after that is an outage.
MAX_MOVED = 3


class Waiter(Protocol):
    def wait(self, keys: Sequence[str], seconds: float) -> bool: ...

    def close(self) -> None: ...


def check_timeout(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"timeout must be a number of seconds, not {type(value).__name__}")
    if not finite(value) or value < 0:
        raise ValueError(f"timeout must be a finite, non-negative number of s, got {brief(value)}")
    return float(value)


def longest_block(client: Any) -> float | None:
    """Return how long a blocking command may wait on ``client`` (None: no limit).

    A reply that takes longer than the socket timeout raises ``TimeoutError``, so a wait
    stops half a second short of it (at a quarter of a timeout under 2/3 s): Redis may
    answer a blocking command up to one ``hz`` tick (100 ms by default) after its timeout.
    """
    timeout = socket_timeout(client)
    if timeout is None:
        return None
    return timeout - min(0.5, 0.75 * timeout)


def socket_timeout(client: Any) -> float | None:
    """Return the socket (read) timeout of ``client``'s connections (None: none)."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        kwargs = getattr(pool, "connection_kwargs", None) or {}
        connection_class = getattr(pool, "connection_class", None)
    else:  # a RedisCluster: every node's connections are made from these
        manager = getattr(client, "nodes_manager", None)
        kwargs = getattr(manager, "connection_kwargs", None) or {}
        connection_class = kwargs.get("connection_class") or _connection_class()
    if "socket_timeout" in kwargs:
        timeout = kwargs["socket_timeout"]
    else:
        # from_url() without socket_timeout leaves it out of the kwargs: the connection
        # class's own default applies (5 s from redis-py 8 on, none before).
        timeout = _default_socket_timeout(connection_class)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        return None
    return float(timeout)


def _connection_class() -> object:
    from redis.connection import Connection

    return Connection


def _default_socket_timeout(connection_class: object) -> object:
    for klass in getattr(connection_class, "__mro__", ()):
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            parameter = inspect.signature(init).parameters.get("socket_timeout")
        except (TypeError, ValueError):
            return None
        if parameter is not None:
            return parameter.default
    return None


def waiter(client: Any, cluster: bool) -> Waiter:
    """How ``client`` waits: doorbells on a Cluster, one ``BLPOP`` on one Redis, or, for a
    client whose socket timeout is too short for any ``BLPOP`` (see ``HZ_SLACK``), polls."""
    timeout = socket_timeout(client)
    if timeout is not None and timeout - (longest_block(client) or 0.0) < HZ_SLACK:
        return Polling(client, cluster)
    return Doorbells(client) if cluster else BlockingWait(client)


class BlockingWait:
    """One Redis: one ``BLPOP`` over every key, never longer than the socket allows."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.longest = longest_block(client)

    def wait(self, keys: Sequence[str], seconds: float) -> bool:
        """Pop a token from any of ``keys``; False if none came within ``seconds`` (or
        the reply came too late). A reply later than the socket timeout is no token, not an
        outage: the pop leaves Redis the timeout less its own wait to answer (half a second
        of the default 1 s), and a Redis that stalls that long (busy with a slow command, a
        fork, a starved host) answers every other command in time. A Redis that is really
        frozen fails the caller's next call; a token popped but never read delays its waiter
        by one wait of theirs at most. (A Cluster's doorbells take a late reply so too.)
        A wait shorter than ``MIN_BLOCK`` may block that long, one longer than
        ``MAX_BLOCK`` blocks no longer."""
        seconds = min(seconds, MAX_BLOCK if self.longest is None else self.longest)
        try:
            return self.client.blpop(list(keys), timeout=max(seconds, MIN_BLOCK)) is not None
        except ReadTimeout:  # the connection is closed: a late reply is never read
            return False

    def close(self) -> None:
        pass


class Polling:
    """A client whose socket timeout is too short for any ``BLPOP``, on one Redis or on a
    Cluster (a pipeline of one ``LPOP`` per key: one round trip per master)."""

    def __init__(self, client: Any, cluster: bool = False) -> None:
        self.client = client
        self.cluster = cluster

    def wait(self, keys: Sequence[str], seconds: float) -> bool:
        """Take a token from any of ``keys`` within ``seconds``, looking every
        ``POLL_EVERY``; at least one look, and one ``POLL_EVERY`` asleep when there is no
        token (so a caller's loop never spins). A token of each list is taken at once (one
        round trip): one that was meant for another waiter costs it one ``POLL_EVERY``, or
        one of its own waits. On a Cluster, the lists of a master that does not answer are
        left out of this wait, as a doorbell's: it fails only when none is left."""
        deadline = time.monotonic() + max(seconds, POLL_EVERY)
        left_keys, failure = list(dict.fromkeys(keys)), None
        while True:
            replies = self._look(left_keys)
            if any(reply is not None and not isinstance(reply, Exception) for reply in replies):
                return True  # a token taken is used, whatever another list's error
            for reply in replies:
                if isinstance(reply, ResponseError):  # as BLPOP's: a WRONGTYPE is named
                    raise reply
            failed = {key: r for key, r in zip(left_keys, replies, strict=True)
                      if isinstance(r, Exception)}  # fmt: skip
            if failed:
                failure = failure or next(iter(failed.values()))
                left_keys = [key for key in left_keys if key not in failed]
                if not left_keys:
                    raise failure
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(POLL_EVERY, left))

    def _look(self, keys: list[str]) -> list[Any]:
        """One ``LPOP`` per key, in one pipeline: each reply, or its error. A Cluster's
        pipeline fails whole when one master does not answer: each key is then popped on
        its own."""
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.lpop(key)
        try:
            return list(pipe.execute(raise_on_error=False))
        except RedisError:
            if not self.cluster or len(keys) < 2:
                raise
        replies: list[Any] = []
        for key in keys:
            try:
                replies.append(self.client.lpop(key))
            except RedisError as exc:
                replies.append(exc)
        return replies

    def close(self) -> None:
        pass


@dataclass(eq=False)
class _Waiting:
    """One thread's wait: set once, by the doorbell that gives it a token, or by the last
    of its doorbells to fail (a master down leaves the others' lists to wait on)."""

    event: threading.Event = field(default_factory=threading.Event)
    won: bool = False
    error: BaseException | None = None
    bells: int = 0  # its doorbells that have not failed


@dataclass(eq=False)
class _Bell:
    key: str
    waiters: list[_Waiting] = field(default_factory=list)
    ringing: bool = False  # a thread serves this key


class Doorbells:
    """A Cluster: one thread per waited-on list, shared by the threads of a process."""

    def __init__(self, client: Any) -> None:
        self.client = client
        longest = longest_block(client)
        self.block = BELL_BLOCK if longest is None else max(MIN_BLOCK, min(BELL_BLOCK, longest))
        self._lock = threading.Lock()
        self._bells: dict[str, _Bell] = {}
        self._closed = False
        self._nodes: dict[int, Any] = {}  # the masters' clients the doorbells block on

    def wait(self, keys: Sequence[str], seconds: float) -> bool:
        me = _Waiting(bells=len(dict.fromkeys(keys)))
        with self._lock:
            if self._closed:
                raise RuntimeError("the engine was closed")
            for key in dict.fromkeys(keys):
                bell = self._bells.setdefault(key, _Bell(key))
                bell.waiters.append(me)
                if not bell.ringing:
                    bell.ringing = True
                    name = f"delayjobs-doorbell:{key}"
                    threading.Thread(
                        target=self._ring, args=(bell,), name=name, daemon=True
                    ).start()
        try:
            me.event.wait(max(seconds, MIN_CLUSTER_WAIT))
        finally:
            with self._lock:
                me.event.set()  # from now on no doorbell hands this wait a token
                for key in keys:
                    found = self._bells.get(key)
                    if found is not None and me in found.waiters:
                        found.waiters.remove(me)
        if me.error is not None and not me.won and me.bells <= 0:
            raise me.error
        return me.won

    def _ring(self, bell: _Bell) -> None:
        moved = 0
        while True:
            with self._lock:
                if self._closed or not bell.waiters:
                    bell.ringing = False
                    return
            try:
                # The master's own client, not the cluster client: no retries behind our
                # back (a failover is the worker's to ride through), and a blocked pop ends
                # at once when the engine closes its connections.
                node = self._node_client(bell.key)
                popped = node.blpop([bell.key], timeout=self.block)
            except ReadTimeout:
                continue  # a late reply, not an outage (see ``BlockingWait.wait``)
            except MovedError as exc:
                # The slot moved to another master: read the slot table anew, as redis-py
                # does for its own commands, and block there (a process that only waits
                # would otherwise meet the old master's MOVED at every wait).
                moved += 1
                if moved <= MAX_MOVED and self._read_slots():
                    continue
                self._fail(bell, exc)
                return
            except Exception as exc:  # unreachable, failover...: every waiter hears it
                self._fail(bell, exc)
                return
            moved = 0
            if popped is not None and not self._hand_over(bell):
                # Nobody here wants it any more: leave it for another process (a token
                # lost on the way delays a waiter by one tick at most).
                with contextlib.suppress(Exception):
                    node.lpush(bell.key, popped[1])

    def _read_slots(self) -> bool:
        """Read the Cluster's slot table anew; False if that failed (the error is left to
        the next command, which meets it too)."""
        try:
            self.client.nodes_manager.initialize()
        except Exception:
            return False
        return True

    def _fail(self, bell: _Bell, exc: BaseException) -> None:
        """End ``bell``; a waiter that has no other doorbell left gets ``exc`` (the first
        of its doorbells' errors): one master down stops no wait on the others."""
        with self._lock:
            for waiting in bell.waiters:
                if not waiting.event.is_set():
                    waiting.error = waiting.error or exc
                    waiting.bells -= 1
                    if waiting.bells <= 0:
                        waiting.event.set()
            bell.waiters.clear()
            bell.ringing = False

    def _node_client(self, key: str) -> Any:
        node = self.client.get_node_from_key(key)
        found = node.redis_connection if node.redis_connection is not None else self.client
        with self._lock:
            self._nodes[id(found)] = found
        return found

    def _hand_over(self, bell: _Bell) -> bool:
        with self._lock:
            for waiting in bell.waiters:
                if not waiting.event.is_set():
                    waiting.won = True
                    waiting.event.set()
                    bell.waiters.remove(waiting)
                    return True
        return False

    def close(self) -> None:
        """Wake every waiter and end every doorbell now: a pop still blocked would outlive
        the engine by up to a second and take (then hand back) a token meant for others."""
        with self._lock:
            self._closed = True
            for bell in self._bells.values():
                for waiting in bell.waiters:
                    waiting.event.set()
                bell.waiters.clear()
            nodes = list(self._nodes.values())
        for node in nodes:  # closes the connections in use too: the blocked pops end
            with contextlib.suppress(Exception):
                node.connection_pool.disconnect()
