"""The Redis key layout of one queue (or shard). Every key shares one hash tag: one slot."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass

# Letters, digits and ``_ . -``: nothing that could close the hash tag (``}``),
# split a key (``:``) or need quoting in a log line.
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


def validate_name(value: object, what: str) -> str:
    """Return ``value`` if it can be part of a key, else raise ``TypeError``/``ValueError``."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if not _NAME.fullmatch(value):
        shown = str.__repr__(value)  # str's own: a subclass's __repr__ may raise
        shown = shown if len(shown) <= 70 else f"{shown[:67]}..."
        raise ValueError(
            f"{what} {shown} is not valid: use 1 to 64 letters, digits, '_', '.' or '-'"
        )
    return value


def is_valid_name(value: object) -> bool:
    """Whether ``validate_name`` accepts ``value`` (for names read back, never trusted)."""
    return isinstance(value, str) and _NAME.fullmatch(value) is not None


@dataclass(frozen=True)
class QueueKeys:
    """Names of the keys that hold one queue."""

    pending: str  # ZSET id -> due time (ms)
    ready: str  # LIST ids due now, FIFO; may also hold stale entries (see ready_set)
    # SET of the ids really in ready. An id removed while ready (a cancel) leaves only this
    # set, in O(1); its entry in the list becomes a tombstone that claim pops and skips.
    ready_set: str
    unack: str  # ZSET id -> lease deadline (ms)
    garbage: str  # ZSET id -> time it died (ms)
    wake: str  # LIST of at most one token: wakes a sleeping promoter
    notify: str  # LIST of tokens: wakes idle workers when ids enter ready
    workers: str  # ZSET worker id -> heartbeat expiry (ms)
    worker_info: str  # HASH worker id -> JSON description
    counters: str  # HASH event -> count (added, removed, acked, nacked, buried, recovered)
    # HASH id -> priority (-100..100), for ids whose priority is not 0: kept from add until
    # the id is acked, removed or purged (a retry keeps its priority); promote reads it.
    priority: str

    @classmethod
    def for_queue(cls, prefix: str, queue: str) -> QueueKeys:
        return cls.for_tag(f"{prefix}:{queue}")

    @classmethod
    def for_tag(cls, tag: str) -> QueueKeys:
        """The keys of one shard: every name starts with ``{<tag>}`` (see sharding.py)."""
        return cls(**{name: f"{{{tag}}}:{name}" for name in cls.__dataclass_fields__})

    def claims(self, claimer: str) -> str:
        """The record of ``claimer``'s last claim (see claims.py): in the queue's hash tag,
        one per claimer, so it is none of the fixed keys above."""
        return _claims(self.unack, claimer)

    def __iter__(self) -> Iterator[str]:
        return iter(getattr(self, name) for name in self.__dataclass_fields__)


@functools.lru_cache(maxsize=4096)  # per shard and claimer: not built (nor checked) per claim
def _claims(unack: str, claimer: str) -> str:
    return f"{unack.removesuffix(':unack')}:claim:{validate_name(claimer, 'claimer')}"
