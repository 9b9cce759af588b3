"""Claims that a lost reply does not strand.

A claim is one script, and Redis runs it even when its caller has stopped waiting: a read
timeout while Redis stalled (a fork for a snapshot of a large dataset, a slow command, a
stopped process) leaves the ids it took in flight, held by nobody, until their lease ends
and ``recover_expired`` hands them back (300 s late with the default lease).

A claim that carries a ``ClaimToken`` records what it took, in the shard's hash tag
(``{<prefix>:<queue>}:claim:<claimer>``, one STRING per claimer, overwritten by each of its
claims that takes ids). Sent again with the same token, it takes nothing new and returns
those ids, if they are still in flight under the lease it gave them. The record lasts
``RECORD_SHARE`` of the lease, so the ids a repeated call returns still have a third of it
left, and a record never outlives its ids' lease: once ``recover_expired`` can hand them
to another worker, no repeated call returns them.
"""

from __future__ import annotations

import itertools
import time
import uuid
from dataclasses import dataclass

from .keys import validate_name
from .validation import MAX_DUE_MS, brief

#: The part of a claim's lease its record lasts. A worker extends its leases every
#: ``LEASE_SECONDS / 3`` at most, so the ids a repeated call returns are extended before
#: their lease can end.
RECORD_SHARE = 2 / 3

#: The largest ``call``: a 64-bit counter (``Claimer``'s never gets there).
MAX_CALL = 2**63 - 1


def record_ms(lease_ms: int) -> int:
    """How long the record of a claim with a lease of ``lease_ms`` lasts (0: none)."""
    return int(min(lease_ms, MAX_DUE_MS) * RECORD_SHARE)  # a whole number Redis takes


@dataclass(frozen=True)
class ClaimToken:
    """One claim call: ``claimer`` names the record (one per thread that claims) and
    ``call`` tells its calls apart. The same token sent again is the same call."""

    claimer: str
    call: int

    def __post_init__(self) -> None:
        validate_name(self.claimer, "claimer")
        # Exactly an int: redis-py sends an int's repr, which for a bool is refused and for
        # an int subclass (IntEnum) is not its digits, so a call sent again would not match.
        if type(self.call) is not int:
            raise TypeError(f"call must be an int, not {type(self.call).__name__}")
        if not 0 <= self.call <= MAX_CALL:
            raise ValueError(f"call must be between 0 and {MAX_CALL}, got {brief(self.call)}")


class Claimer:
    """The tokens of one thread's claims: for each shard, the token of its last claim
    until one is answered (Redis may have run a call whose reply was lost), then a new
    one. Not shared between threads: two threads' calls would be one call."""

    def __init__(self) -> None:
        self.name = uuid.uuid4().hex
        self._calls = itertools.count()
        # shard -> token of its last claim, and when it was first sent (time.monotonic())
        self._unanswered: dict[str, tuple[ClaimToken, float]] = {}

    def token(self, shard: str) -> ClaimToken:
        """The token of the next claim from ``shard``."""
        if shard not in self._unanswered:
            self._unanswered[shard] = ClaimToken(self.name, next(self._calls)), time.monotonic()
        return self._unanswered[shard][0]

    def since(self, shard: str, sent: float, lease_ms: float) -> float:
        """The earliest time (``time.monotonic()``) the leases of the ids a claim from
        ``shard`` sent at ``sent`` returned as sent again (``Leased.replayed``) may have
        been set: no earlier than its first sending, nor than the record's life before.
        The ids a call takes afresh were leased by it: counted from ``sent``."""
        first = self._unanswered[shard][1] if shard in self._unanswered else sent
        return max(first, sent - record_ms(int(lease_ms)) / 1000)

    def answered(self, shard: str) -> None:
        """A claim from ``shard`` was answered: the next one is a new call."""
        self._unanswered.pop(shard, None)
