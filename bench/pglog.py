"""The server-side duration of the worker's statements, read from PostgreSQL's own log.

``bench/prune.py --statement-log PATH`` sets ``log_min_duration_statement = 0`` on its
database for the run (every statement of every session is logged with its duration) and
reads the lines the run added to PATH, the server's log file, with ``statements()``. The
default ``log_line_prefix`` (``%m [%p] %q%u@%d``) is assumed: a timestamp and the
backend's pid start each line.

Each statement is put in the phase its end time falls in and, during the prune, in
"prune busy" when one of the prune's statements (its backend issues the DELETEs) was
executing at the same time, else "prune idle". Transactions are told apart by their
statements: a claim (the job's ``running`` UPDATE, committed without waiting for the disk)
or an outcome (its final UPDATE, which waits).
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

LINE = re.compile(
    r"^(\S+ \S+) \S+ \[(\d+)\] \S* ?LOG:  duration: ([0-9.]+) ms  "
    r"(?:statement|execute [^:]*): (.*)"
)

CLAIM = re.compile(r"""^UPDATE \S+ SET "?status"? = 'running'""")


def parse(lines: Iterable[str]) -> Iterator[tuple[float, int, float, str]]:
    """(end time, pid, duration in ms, statement) of each logged statement execution."""
    for line in lines:
        m = LINE.match(line)
        if m:
            end = datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S.%f").timestamp()
            yield end, int(m[2]), float(m[3]), m[4]


def kind(statement: str) -> str | None:
    words = statement.split(None, 1)
    verb = words[0].upper() if words else ""
    if verb == "UPDATE":
        return "claim UPDATE" if CLAIM.search(statement) else "outcome UPDATE"
    if verb == "INSERT" and "jobevent" in statement:
        return "event INSERT"
    return "COMMIT" if verb == "COMMIT" else None


def statements(path: Path, offset: int, prune_start: float, prune_end: float) -> dict[str, Any]:
    """Duration percentiles (ms) of the worker's statements logged after ``offset`` bytes
    of ``path``, by kind and phase: (a) before ``prune_start``, (b) "prune busy" and
    "prune idle", (c) after ``prune_end``."""
    with path.open(errors="replace") as log:
        log.seek(offset)
        rows = list(parse(log))
    prune_pids = {pid for _, pid, _, s in rows if s.startswith("DELETE FROM")}
    busy = sorted((end - ms / 1000, end) for end, pid, ms, _ in rows if pid in prune_pids)
    starts = [b[0] for b in busy]

    def overlaps_prune(t0: float, t1: float) -> bool:
        i = bisect.bisect_right(starts, t1)
        return any(busy[j][1] >= t0 for j in range(max(0, i - 20), i))

    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    tx: dict[int, set[str]] = defaultdict(set)  # what each backend's transaction did
    for end, pid, ms, statement in rows:
        what = kind(statement)
        if pid in prune_pids or what is None:
            continue
        if what == "COMMIT":
            seen = tx.pop(pid, set())
            what = "outcome COMMIT" if "outcome UPDATE" in seen else (
                "claim COMMIT" if "claim UPDATE" in seen else "other COMMIT")  # fmt: skip
        else:
            tx[pid].add(what)
        if end < prune_start:
            phase = "a"
        elif end > prune_end:
            phase = "c"
        else:
            phase = "b, prune busy" if overlaps_prune(end - ms / 1000, end) else "b, prune idle"
        groups[(what, phase)].append(ms)
    out: dict[str, Any] = {}
    for (what, phase), values in sorted(groups.items()):
        values.sort()

        def pct(p: float, v: list[float] = values) -> float:
            return round(v[min(len(v) - 1, round(p / 100 * (len(v) - 1)))], 2)

        out.setdefault(what, {})[phase] = {
            "n": len(values), "p50_ms": pct(50), "p99_ms": pct(99), "max_ms": round(values[-1], 2)
        }  # fmt: skip
    return out
