"""Where the time of one job goes: ``schedule()`` and the worker, step by step.

    python bench/hotpath.py [--n 3000] [--database-url URL] [--profile [cumulative]]

Runs in one process on a private ``redis-server`` and the bench's Django settings
(``peers/dj_settings.py``: SQLite in WAL mode with synchronous=NORMAL, or the database
given). It times each step by wrapping the functions that do it, so the figures include
the wrappers' own small cost; steps indented under another are part of it. ``--profile``
prints cProfile's top functions for each part instead, by their own time
(``--profile cumulative``: by the time spent in them and below). ``--wal`` (SQLite) also
counts the pages each part writes to the WAL, per job and per commit: a commit writes
every page it changed, so this is where a job's disk writes go. No checkpoint runs while
it counts (as in a worker process, whose housekeeping thread checkpoints), so the times
then leave out the checkpoints that ``schedule()``'s commits would otherwise run.

1. ``schedule()`` one at a time, N jobs due in an hour (no worker).
2. N jobs due now, drained by one worker thread (``WorkerProcess.work_loop`` in burst
   mode, as ``run_delayworker --burst``), the bench's job (an ``RPUSH`` to Redis) included.
3. ``schedule_many`` of N more jobs due in an hour, in chunks of 1,000 (the bench's batch
   path), after the worker: parts 1 and 2 run as they did before it was added.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

from peers.delayjobs_peer import private_environment  # noqa: E402

spent: Counter[str] = Counter()
calls: Counter[str] = Counter()
absent: set[str] = set()  # steps whose function the package no longer has


@contextmanager
def timed(target: Any, name: str, label: str) -> Iterator[None]:
    """Add the time spent in ``target.name`` to ``spent[label]`` while inside (a step whose
    function was renamed or removed is reported as such, not a crash)."""
    original = getattr(target, name, None)
    if original is None:
        absent.add(label)
        yield
        return

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - start
            calls[label] += 1

    setattr(target, name, wrapper)
    try:
        yield
    finally:
        setattr(target, name, original)


def measure(title: str, n: int, run: Callable[[], None], steps: list[tuple[Any, str, str]],
            profile: str | None, wal: bool) -> None:  # fmt: skip
    spent.clear()
    calls.clear()
    if profile:
        profiler = cProfile.Profile()
        profiler.runcall(run)
        print(f"\n{title}: cProfile, top 25 by {profile} time")
        pstats.Stats(profiler).sort_stats(profile).print_stats(25)
        return
    pages = WalPages() if wal else None
    with pages or contextlib.nullcontext(), contextmanager_all(steps):
        start = time.perf_counter()
        run()
        total = time.perf_counter() - start
    print(f"\n{title}: {n / total:,.0f} jobs/s, {total / n * 1e6:,.0f} us per job")
    for target, name, label in steps:
        if label in absent:
            where = getattr(target, "__name__", type(target).__name__)
            print(f"  {label:<38}      n/a ({where}.{name} not found)")
        else:
            per_job = f"({calls[label] / n:.2f} per job)"
            print(f"  {label:<38} {spent[label] / n * 1e6:8,.0f} us  {per_job}")
    if pages is not None:
        commits = calls[COMMIT]
        print(f"  WAL pages written: {pages.written / n:.1f} per job,"
              f" {pages.written / max(commits, 1):.1f} per commit")  # fmt: skip


class WalPages:
    """The pages (WAL frames) SQLite writes to the WAL while inside, with checkpoints left
    out: the WAL is emptied first and only grows meanwhile. An extra connection stays
    open throughout, so that the worker closing its own (the last one) does not
    checkpoint and remove the WAL."""

    def __enter__(self) -> WalPages:
        from django.db import connection

        from django_delayjobs import walcheckpoint

        path = connection.settings_dict["NAME"]
        self.wal = Path(f"{path}-wal")
        self.keeper = sqlite3.connect(path)
        connection.close()  # reopened under take_over(): no checkpoint in its commits
        walcheckpoint.take_over()
        busy = self.keeper.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        if busy:
            raise RuntimeError("the WAL could not be emptied before counting")
        self.frame = self.keeper.execute("PRAGMA page_size").fetchone()[0] + 24
        return self

    def __exit__(self, *exc: object) -> None:
        from django.db import connection

        from django_delayjobs import walcheckpoint

        size = self.wal.stat().st_size if self.wal.exists() else 0
        self.written = max(0, size - 32) // self.frame  # a 32-byte header, then the frames
        walcheckpoint.give_back()
        connection.close()
        self.keeper.close()


@contextmanager
def contextmanager_all(steps: list[tuple[Any, str, str]]) -> Iterator[None]:
    if not steps:
        yield
        return
    (target, name, label), *rest = steps
    with timed(target, name, label), contextmanager_all(rest):
        yield


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--database-url", help="audit rows there instead of SQLite")
    parser.add_argument(
        "--profile", nargs="?", const="tottime", choices=("tottime", "cumulative"),
        help="cProfile instead of timers, by own time (default) or cumulative time",
    )  # fmt: skip
    parser.add_argument("--wal", action="store_true", help="count WAL pages (SQLite)")
    args = parser.parse_args()
    if args.wal and args.database_url:
        parser.error("--wal counts SQLite's WAL pages: leave out --database-url")
    with private_environment("hotpath", args.database_url):
        run(args.n, args.profile, args.wal)


COMMIT = "commit"


def run(n: int, profile: str | None, wal: bool) -> None:
    from peers.delayjobs_peer import Adapter

    adapter = Adapter()
    adapter.reset()
    import peers.common
    from django.db.backends.base.base import BaseDatabaseWrapper

    from django_delayjobs import execution, services, sql
    from django_delayjobs.connection import get_engine
    from django_delayjobs.engine.engine import Engine
    from django_delayjobs.worker import Options, WorkerProcess

    print(f"audit rows: {adapter.settings['audit rows']}; N = {n:,}")
    due = time.time() + 3600
    adapter.schedule("warm-up", due)

    def schedule_one_at_a_time() -> None:
        for i in range(n):
            adapter.schedule(f"s{i}", due)

    measure(
        "schedule() one at a time",
        n,
        schedule_one_at_a_time,
        [
            (services, "build_job", "build_job (validate, build the row)"),
            (services, "_insert", "insert the job and its event"),
            (sql, "insert_events", "  the event"),
            (BaseDatabaseWrapper, "commit", COMMIT),
            (Engine, "add", "engine.add (one Redis round trip)"),
        ],
        profile,
        wal,
    )
    now = time.time()
    adapter.schedule_batch([(f"d{i}", now) for i in range(n)])
    worker = WorkerProcess(get_engine(), Options(queues=["default"], burst=True))
    measure(
        "worker, one thread draining due jobs",
        n,
        worker.work_loop,
        [
            (Engine, "claim", "Redis claim (PREFETCH ids per call)"),
            (execution.Execution, "claim", "claim transaction"),
            (sql, "claim", "  UPDATE ... RETURNING"),
            (execution.Execution, "execute", "action transaction"),
            (peers.common, "record", "  the job itself (RPUSH)"),
            (sql, "update_fenced", "  fenced outcome UPDATE"),
            (sql, "insert_events", "events (started, succeeded), in both"),
            (BaseDatabaseWrapper, "commit", COMMIT),
            (Engine, "ack", "Redis ack (one call per batch)"),
        ],
        profile,
        wal,
    )

    items = [(f"b{i}", due) for i in range(n)]
    measure(
        "schedule_many, chunks of 1,000",
        n,
        lambda: adapter.schedule_batch(items),
        [
            (services, "build_job", "build_job (validate, build the row)"),
            (services.door, "check_batch", "check the batch"),
            (sql, "insert_jobs", "insert the jobs and their events"),
            (BaseDatabaseWrapper, "commit", COMMIT),
            (services, "push", "push (Redis, one call per chunk)"),
        ],
        profile,
        wal,
    )


if __name__ == "__main__":
    main()
