"""The directory ``{<prefix>}:queues``: every queue and shard name that holds ids.

A shard is listed by the first ``add`` that finds it empty (after a flush too), so a
shard that holds ids is always listed, and promoters and workers, which serve every
listed shard of their queues, can never strand one: after a change of a queue's shard
count, the shards of the old count are served until they are empty, then forgotten.
The key lies outside every queue's hash tag, so it is written beside the scripts. On a
Cluster it lives on one master, which may lose its data while the shards' masters keep
theirs: promoters list their queues' current shards again every minute (``list_shards``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from .errors import EngineUnavailable, WrongType, unreachable
from .sharding import Shard, parse

#: How long a read of the directory is reused. A shard listed by another process is
#: served here within this long.
DIRECTORY_TTL = 5.0


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Directory:
    def __init__(self, client: Any, key: str, call: Callable[[Callable[[], Any]], Any],
                 *, one_server: bool = False) -> None:  # fmt: skip
        self.client = client
        self.key = key
        self._call = call
        self.one_server = one_server
        self._lock = threading.Lock()
        self._read_at = 0.0
        self._known = False  # read once at least
        self._shards: dict[str, set[Shard]] = {}

    def _run(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` through ``call``; a directory of the wrong type is named."""
        try:
            return self._call(fn)
        except WrongType as exc:
            raise WrongType(
                f"the directory of queues {self.key} is not a set (another program wrote "
                "it?): delete it, and promoters list their queues in it again within a "
                f"minute ({exc})"
            ) from exc

    def register(self, shard: Shard) -> None:
        self._run(lambda: self.client.sadd(self.key, shard.name))
        with self._lock:
            self._shards.setdefault(shard.queue, set()).add(shard)

    def register_all(self, shards: list[Shard]) -> None:
        """List ``shards`` in one call (they may be listed already)."""
        if shards:
            self._run(lambda: self.client.sadd(self.key, *(shard.name for shard in shards)))
            with self._lock:
                for shard in shards:
                    self._shards.setdefault(shard.queue, set()).add(shard)

    def forget(self, shard: Shard) -> None:
        self._run(lambda: self.client.srem(self.key, shard.name))
        with self._lock:
            self._shards.get(shard.queue, set()).discard(shard)

    def last(self) -> set[str]:
        """The queues listed when the directory was last read (none before), unread."""
        with self._lock:
            return set(self._shards)

    def listed(self, queue: str | None = None, *, fresh: bool = False) -> dict[str, set[Shard]]:
        """Return queue -> its listed shards (read at most DIRECTORY_TTL ago unless fresh).

        A read that fails (the directory's master is failing over, or its key is another
        program's, of the wrong type) lists what was last read, or nothing if none was:
        callers serve their queues' current shards (every queue's only shard, for a queue
        never split), not none at all; it is read again after ``DIRECTORY_TTL``. (On a
        Cluster, a process that started while the directory's master was down served no
        queue at all until it was back.) ``fresh`` reads raise, so the failure is named
        where queues are listed (stats, metrics); the reads after it within
        ``DIRECTORY_TTL`` use what was last read, as after any read that failed (a frozen
        master is not waited for twice in a row). On one Redis (``one_server``) a read
        that Redis does not answer raises too (not a refusal or a key of the wrong type):
        the caller's next call would wait for the same timeout (a promote, a claim, a
        ``stats`` waited for two, once per ``DIRECTORY_TTL``).
        """
        if fresh or not self._known or time.monotonic() - self._read_at >= DIRECTORY_TTL:
            try:
                members = self._run(lambda: self.client.smembers(self.key))
            except EngineUnavailable as exc:
                if self.one_server and unreachable(exc):
                    raise
                if fresh:  # named; the reads within DIRECTORY_TTL use what was last read
                    with self._lock:  # (on a Cluster: not one more wait for a frozen master)
                        self._read_at, self._known = time.monotonic(), True
                    raise
                members = {shard.name for found in self._shards.values() for shard in found}
            shards: dict[str, set[Shard]] = {}
            for member in members:
                try:
                    shard = parse(_text(member))
                except (TypeError, ValueError):
                    continue  # not a name this version writes: ignore, never crash on it
                shards.setdefault(shard.queue, set()).add(shard)
            with self._lock:
                self._shards, self._read_at, self._known = shards, time.monotonic(), True
        with self._lock:
            if queue is not None:
                return {queue: set(self._shards.get(queue, ()))}
            return {name: set(found) for name, found in self._shards.items()}
