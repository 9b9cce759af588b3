"""Leases that tell their holder: an extension keeps only a lease its claimer holds.

An id in flight has one score in unack, its lease's deadline in ms. A claim and an
extension each set it to ``TIME`` + the lease + the holder's fraction of a millisecond
(``Holder``: one per engine, picked at random once), and give the score back exactly as
Redis holds it. The holder passes that score to its next extension, which extends the id
only while unack still holds a lease of this holder: that score, or any score that ends in
the holder's fraction. Once the lease has ended without its holder noticing (Redis lost
its data and the id was added again, or the holder froze past its lease and
``recover_expired`` handed it back) and another worker has claimed the id, the score is
that worker's, with that worker's fraction, and the first holder's extension reports the
id lost instead of taking it over. A nack checks it too: it moves an id only under a lease
of its holder, or a whole ms, which no holder sets (``adopt``'s), so a worker that reaches
an id it lost, and defers or hands it back, leaves it in flight under the other worker's
lease instead of putting it in pending for a third one. Without the fraction, two leases
set in the same millisecond with the same length (or lengths that differ as much as their
start) would be the same score.

The fraction names the holder, not the call: an extension whose reply was lost (Redis
stalled past the client's timeout, then ran it) moved the score to one its holder was never
told, and the next extension (or a Cluster client's retry) names the old one. It still
finds a score with its own fraction and keeps the id; a fraction per call made every id it
extended look lost (none started, each left in flight under a lease nobody held until
``LEASE_SECONDS`` ended). Two holders share a fraction one time in 4095 (of N holders
live at once, some two of them about N*(N-1)/8190 of the time): each then takes the other's
leases for its own, and an id lost to the other is kept and run by both, as before leases
had owners (and nacked by either).

The fraction costs nothing: no key, no round trip, and the score stays the deadline (a
reader that takes whole ms sees the millisecond it ends in). A score near today's times
(about 1.8e12) is a double with 1/4096 ms to spare (below 2^41 ms, until 2039; 1/2048
after): the fraction is a multiple of 1/4096, which the sum keeps exact until then and
``math.fmod(score, 1)`` gives back exactly (fmod is always exact). After 2039 the sum rounds
the fraction to 1/2048: the script compares the score's fraction with the holder's added to
the score's whole ms, which rounds the same way. The holder passes the score Redis gave
back, so rounding never makes its own lease look another's. A fraction that rounds to a
whole ms then (1/4096 or 4095/4096 may) makes its holder's leases look like no holder's to
a nack, which moves them whoever nacks them, as before leases had owners.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable, Mapping

from .results import Leased
from .validation import check_ids

#: A lease's fraction of a millisecond is one of ``1 / STEPS .. (STEPS - 1) / STEPS``.
STEPS = 4096


def fraction() -> str:
    """A random fraction of a millisecond, written exactly (a multiple of a power of two:
    ``repr`` gives every digit)."""
    return repr(random.randrange(1, STEPS) / STEPS)


class Holder:
    """The fraction of a millisecond every lease of one holder (an engine) ends in. Picked
    again in a forked child: a process forked with its parent's engine is another holder."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._fraction = fraction()

    @property
    def fraction(self) -> str:
        if os.getpid() != self._pid:
            self._pid, self._fraction = os.getpid(), fraction()
        return self._fraction


def check_leases(ids: Iterable[str] | Mapping[str, str | None]) -> dict[str, str]:
    """Return id -> the lease its holder holds ("" for an id whose lease is kept whoever
    holds it: every id of a plain list). A ``Leased`` (a claim's or an extension's reply)
    stands for its ``leases``: a list, it would mean "whoever holds them"."""
    if isinstance(ids, Leased):
        ids = ids.leases
    if not isinstance(ids, Mapping):
        return dict.fromkeys(check_ids(ids), "")
    checked = check_ids(ids.keys())
    for id_ in checked:
        lease = ids[id_]
        if lease is not None and not isinstance(lease, str):
            raise TypeError(f"a lease must be a str (as a claim returns it) or None, not "
                            f"{type(lease).__name__}")  # fmt: skip
    return {id_: ids[id_] or "" for id_ in checked}
