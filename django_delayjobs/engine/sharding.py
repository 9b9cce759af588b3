"""Shards: a queue split over N hash tags, so one hot queue can use every Cluster master.

A queue of 1 shard keeps the tag it always had, ``{<prefix>:<queue>}``. A queue of N > 1
shards has N *shard names*, ``<queue>#<k>/<N>`` (k = 0..N-1), each with a tag of its own.
The count is part of the name, so changing a queue's count gives it a new, disjoint set of
shards: the old ones stay readable under their old names (and are served until empty),
and no shard ever holds ids placed there under two different counts.

A job's shard is a stable function of its id and the count (jump consistent hash), so
every caller finds it without a lookup table.

Placement: the tag of shard k of N is chosen so that its Cluster slot lies in the middle
of the k-th N-th of the slot range. A cluster whose M masters own equal contiguous slot
ranges (``redis-cli --cluster create``, and the managed services' defaults) then holds
N/M shards per master when M divides N: load spreads evenly, not by luck of the CRC.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache, lru_cache

from .keys import validate_name

#: Most shards a queue may have.
MAX_SHARDS = 64
#: Hash slots of a Redis Cluster.
SLOTS = 16384

_SHARD = re.compile(r"(?P<queue>[^#]+)#(?P<index>0|[1-9][0-9]{0,2})/(?P<count>[1-9][0-9]{0,2})")


@dataclass(frozen=True, order=True)
class Shard:
    """One shard of a queue: ``index`` of ``count`` (a queue of 1 shard is its own shard)."""

    queue: str
    index: int = 0
    count: int = 1

    @property
    def name(self) -> str:
        return self.queue if self.count == 1 else f"{self.queue}#{self.index}/{self.count}"

    def __str__(self) -> str:
        return self.name


def parse(name: object, what: str = "queue name") -> Shard:
    """Return the shard a queue or shard name stands for; raise ``TypeError``/``ValueError``.

    A plain queue name stands for its shard 0 of 1, the tag every queue had before shards;
    so does ``<queue>#0/1``, the name that says "that shard" where a queue name would mean
    "wherever each id belongs" (after the queue's count changed from 1).
    """
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a str, not {type(name).__name__}")
    return _parse(name, what)


@lru_cache(maxsize=4096)  # a process uses a few names, on every call: parse each once
def _parse(name: str, what: str) -> Shard:
    if "#" not in name:
        return Shard(validate_name(name, what))
    match = _SHARD.fullmatch(name)
    if match is None:
        raise ValueError(f"{what} {name!r} is not valid: a shard is named '<queue>#<k>/<n>'")
    index, count = int(match["index"]), int(match["count"])
    if not 1 <= count <= MAX_SHARDS or index >= count:
        raise ValueError(
            f"{what} {name!r} is not valid: shard k of n needs 1 <= n <= {MAX_SHARDS}, k < n"
        )
    return Shard(validate_name(match["queue"], what), index, count)


def queue_of(name: str) -> str:
    """The queue a queue or shard name belongs to (``orders#2/6`` -> ``orders``)."""
    return parse(name).queue


def explicit(name: str) -> bool:
    """Whether ``name`` names one shard (``q#k/n``) rather than a queue."""
    return "#" in name


def alone(name: str) -> str:
    """The name of the one shard ``name`` stands for (a queue's or a shard's, as
    ``Engine.shards`` gives them): a queue's own name becomes ``q#0/1``, since by its name a
    queue is also served from the shards of its older counts, which ``Engine.shards``
    lists by their own names."""
    return name if explicit(name) else f"{name}#0/1"


def shards(queue: str, count: int) -> list[Shard]:
    """Every shard of ``queue`` split ``count`` ways."""
    return [Shard(queue, k, count) for k in range(count)] if count > 1 else [Shard(queue)]


def check_count(value: object, what: str = "shard count") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if not 1 <= value <= MAX_SHARDS:
        raise ValueError(f"{what} must be from 1 to {MAX_SHARDS}, not {value}")
    return value


def _key_hash(job_id: str) -> int:
    # surrogateescape: an id read back from Redis that is not UTF-8 (see validation.text)
    digest = hashlib.blake2b(job_id.encode(errors="surrogateescape"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def jump_hash(key: int, buckets: int) -> int:
    """Lamping and Veach's jump consistent hash: ``key`` -> 0..buckets-1."""
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & 0xFFFFFFFFFFFFFFFF
        j = int((b + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return b


def home(queue: str, count: int, job_id: str) -> Shard:
    """The shard of ``queue`` (split ``count`` ways) that holds ``job_id``."""
    if count == 1:
        return Shard(queue)
    return Shard(queue, jump_hash(_key_hash(job_id), count), count)


# -- tags and slots --------------------------------------------------------------------


def crc16(data: bytes) -> int:
    """CRC16-XMODEM, the checksum Redis Cluster hashes keys with."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def slot(tag: str) -> int:
    """The Cluster slot of every key whose hash tag is ``tag``."""
    return crc16(tag.encode()) % SLOTS


@cache
def tag(prefix: str, shard: Shard) -> str:
    """The hash tag (without braces) of a shard's keys.

    Shard k of n gets ``<prefix>:<queue>#k/n``, with ``~<salt>`` appended when needed to
    put its slot in the middle quarter of the k-th n-th of the slot range (about 4n CRCs
    the first time, cached).
    """
    base = f"{prefix}:{shard.queue}"
    if shard.count == 1:
        return base
    width = SLOTS / shard.count
    low = int(width * shard.index + width * 3 / 8)
    high = int(width * shard.index + width * 5 / 8)
    name = f"{base}#{shard.index}/{shard.count}"
    salt = 0
    while True:
        candidate = name if salt == 0 else f"{name}~{salt}"
        if low <= slot(candidate) < high:
            return candidate
        salt += 1
