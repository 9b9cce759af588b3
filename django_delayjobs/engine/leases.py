"""Leases that tell their holder: an extension keeps only a lease its claimer holds.

An id in flight has one score in unack, its lease's deadline in ms. A claim and an
extension each set it to ``TIME`` + the lease + a random fraction of a millisecond
(``fraction()``), and give the score back exactly as Redis holds it. The holder passes that
score to its next extension, which extends the id only while unack still holds that score:
once the lease has ended without its holder noticing (Redis lost its data and the id was
added again, or the holder froze past its lease and ``recover_expired`` handed it back)
and another worker has claimed the id, the score is that worker's, and the first holder's
extension reports the id lost instead of taking it over. Without the fraction, two leases
set in the same millisecond with the same length (or lengths that differ as much as their
start) would be the same score.

The fraction costs nothing: no key, no round trip, and the score stays the deadline (a
reader that takes whole ms sees the millisecond it ends in). A score near today's times
(about 1.8e12) is a double with 1/4096 ms to spare (1/2048 from 2039): the fraction is a
multiple of 1/4096, which the sum keeps exact until then and rounds a little after; the
holder compares the score Redis gave back, so rounding never makes its own lease look
another's.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping

from .validation import check_ids

#: A lease's fraction of a millisecond is one of ``1 / STEPS .. (STEPS - 1) / STEPS``.
STEPS = 4096


def fraction() -> str:
    """A random fraction of a millisecond for the leases one script call sets, written
    exactly (a multiple of a power of two: ``repr`` gives every digit)."""
    return repr(random.randrange(1, STEPS) / STEPS)


def check_leases(ids: Iterable[str] | Mapping[str, str | None]) -> dict[str, str]:
    """Return id -> the lease its holder holds ("" for an id whose lease is kept whoever
    holds it: every id of a plain list)."""
    if not isinstance(ids, Mapping):
        return dict.fromkeys(check_ids(ids), "")
    checked = check_ids(ids.keys())
    for id_ in checked:
        lease = ids[id_]
        if lease is not None and not isinstance(lease, str):
            raise TypeError(f"a lease must be a str (as a claim returns it) or None, not "
                            f"{type(lease).__name__}")  # fmt: skip
    return {id_: ids[id_] or "" for id_ in checked}
