"""Which shard holds an id, and which shards a queue has (see sharding.py)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping

from . import sharding
from .directory import Directory
from .keys import QueueKeys, validate_name
from .sharding import Shard


def check_counts(shards: Mapping[str, int] | int) -> Mapping[str, int] | int:
    """Return a valid shard-count setting: queue -> count, or one count for every queue."""
    if isinstance(shards, Mapping):
        for queue, count in shards.items():
            validate_name(queue, "queue name")
            sharding.check_count(count, f"shard count of {queue!r}")
        return dict(shards)
    return sharding.check_count(shards, "shard count")


@functools.lru_cache(maxsize=4096)  # per shard: every call names its keys, 5 us to build
def _keys(prefix: str, shard: Shard) -> QueueKeys:
    return QueueKeys.for_tag(sharding.tag(prefix, shard))


class Router:
    """Names to keys: a queue name stands for every shard the queue has, a shard name
    (``orders#2/6``) for that shard; ids go to the shard of the queue's current count."""

    def __init__(self, prefix: str, counts: Mapping[str, int] | int, directory: Directory) -> None:
        self.prefix = prefix
        self.counts = check_counts(counts)
        self.directory = directory

    def count(self, queue: str) -> int:
        if sharding.parse(queue).count > 1 or sharding.explicit(queue):
            raise ValueError(f"{queue!r} is a shard's name, not a queue's")
        return self.counts if isinstance(self.counts, int) else self.counts.get(queue, 1)

    def keys(self, shard: Shard) -> QueueKeys:
        return _keys(self.prefix, shard)

    def name(self, shard: Shard) -> str:
        """A name that addresses exactly ``shard``: its own, except for the shard of 1 of a
        queue that has several now (``q`` would mean "wherever each id belongs")."""
        if shard.count == 1 and self.count(shard.queue) != 1:
            return f"{shard.queue}#0/1"
        return shard.name

    def home(self, queue: str, job_id: str) -> Shard:
        return sharding.home(queue, self.count(queue), job_id)

    def served(self, queue: str) -> list[Shard]:
        """The current count's shards, then older ones the directory still lists."""
        current = sharding.shards(queue, self.count(queue))
        listed = self.directory.listed(queue)[queue]
        return current + sorted(listed - set(current))

    def stale(self, queue: str, *, fresh: bool = False) -> list[Shard]:
        """Listed shards of older counts (they empty as their ids run)."""
        current = set(sharding.shards(queue, self.count(queue)))
        return sorted(self.directory.listed(queue, fresh=fresh)[queue] - current)

    def targets(self, name: str) -> list[Shard]:
        """A shard name: that shard. A queue name: every shard it has."""
        shard = sharding.parse(name)
        return [shard] if sharding.explicit(name) else self.served(shard.queue)

    def route(self, name: str, ids: list[str]) -> list[tuple[Shard, list[str]]]:
        """Group ids by the shard that holds them (a shard name: that shard)."""
        shard = sharding.parse(name)
        count = self.count(shard.queue)
        if sharding.explicit(name) or count == 1:
            return [(shard, ids)]
        groups: dict[Shard, list[str]] = {}
        for id_ in ids:
            groups.setdefault(sharding.home(shard.queue, count, id_), []).append(id_)
        return list(groups.items())

    def others(self, name: str, tried: Iterable[Shard], *, fresh: bool = False) -> list[Shard]:
        """Shards where ids missing from their own shard may still be: those of older
        counts (an id only ever enters the shards of one count). ``fresh``: see
        ``Directory.listed``."""
        shard = sharding.parse(name)
        if sharding.explicit(name):
            return []
        skip = set(tried)
        return [s for s in self.stale(shard.queue, fresh=fresh) if s not in skip]
