"""The SQLite pages a job writes when the tables are large: random ids against time-ordered.

    python bench/pages.py [--rows 1000000] [--n 2000] [--ids v7|v4] [--database-url URL]

With ``--rows`` jobs already in the tables (each with one event, inserted in bulk, not
in Redis), it counts what N more jobs write to SQLite's WAL: ``schedule()`` one at a
time (jobs due in an hour), then one worker thread draining N due jobs. For each it reads
the WAL file itself: frames written (each one page, 4 KiB) and the distinct pages among
them, which is what the next checkpoint must copy into the database file. On PostgreSQL
(``--database-url``) it counts the bytes of WAL written after a ``CHECKPOINT`` (a page's
first change after a checkpoint is logged whole). The counts do not depend on the
machine's speed. ``--ids v4`` makes job ids as ``uuid.uuid4`` did
before version 7 ids, for the comparison; same code otherwise. Runs on a private
``redis-server`` and the bench's Django settings (``peers/dj_settings.py``: SQLite in WAL
mode with synchronous=NORMAL); no checkpoint runs while it counts.
"""

from __future__ import annotations

import argparse
import datetime
import sqlite3
import struct
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

from peers.delayjobs_peer import private_environment  # noqa: E402

WAL_HEADER, FRAME_HEADER = 32, 24


def wal_pages(path: Path) -> tuple[int, int]:
    """(frames, distinct pages) in the WAL file at ``path`` since it was last started over."""
    data = path.read_bytes()
    if len(data) < WAL_HEADER:
        return 0, 0
    page_size = struct.unpack(">I", data[8:12])[0]
    salts = data[16:24]
    frames, pages = 0, set()
    offset = WAL_HEADER
    while offset + FRAME_HEADER + page_size <= len(data):
        if data[offset + 8 : offset + 16] != salts:  # a frame of an earlier WAL generation
            break
        pages.add(struct.unpack(">I", data[offset : offset + 4])[0])
        frames += 1
        offset += FRAME_HEADER + page_size
    return frames, len(pages)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--ids", choices=("v7", "v4"), default="v7")
    parser.add_argument("--database-url", help="PostgreSQL: count the WAL bytes instead")
    args = parser.parse_args()
    with private_environment("pages", args.database_url) as workdir:
        run(args.rows, args.n, args.ids, workdir / "pages.sqlite3-wal")


def run(rows: int, n: int, ids: str, wal: Path) -> None:
    from peers.delayjobs_peer import Adapter

    adapter = Adapter()
    adapter.reset()
    from django.db import connection, transaction
    from django.utils import timezone

    from django_delayjobs import walcheckpoint
    from django_delayjobs.connection import get_engine
    from django_delayjobs.models import EventKind, Job, JobEvent
    from django_delayjobs.worker import Options, WorkerProcess

    if ids == "v4":
        Job._meta.pk.default = uuid.uuid4
    print(f"job ids: {ids}; {rows:,} jobs in the tables; N = {n:,}")
    started = time.perf_counter()
    later = timezone.now() + datetime.timedelta(days=1)
    for start in range(0, rows, 10_000):
        batch = [Job(queue="default", action="peers.djapp.models.record", args=["p", 0],
                     run_at=later) for _ in range(min(10_000, rows - start))]  # fmt: skip
        with transaction.atomic():
            Job.objects.bulk_create(batch)
            JobEvent.objects.bulk_create(
                JobEvent(job=job, kind=EventKind.SCHEDULED, actor="code", message="")
                for job in batch
            )
    print(f"  prefilled in {time.perf_counter() - started:.0f} s")

    walcheckpoint.take_over()  # connections opened from now on never checkpoint

    def count(title: str, step: Callable[[], object]) -> None:
        if connection.vendor == "postgresql":
            return count_postgres(title, step)
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA wal_autocheckpoint=0")
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        # Held open: the last connection to close would checkpoint and delete the WAL.
        keep = sqlite3.connect(wal.with_name(wal.name.removesuffix("-wal")))
        keep.execute("SELECT count(*) FROM sqlite_master").fetchone()  # opens the WAL
        try:
            step()
            frames, pages = wal_pages(wal)
        finally:
            keep.close()
        print(f"  {title:<36} {frames / n:6.1f} frames, {pages / n:6.1f} distinct pages per job")

    def count_postgres(title: str, step: Callable[[], object]) -> None:
        with connection.cursor() as cursor:
            cursor.execute("CHECKPOINT")  # each page's first change after it is written whole
            cursor.execute("SELECT pg_current_wal_insert_lsn()")
            (start,) = cursor.fetchone()
        step()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", [start])
            (written,) = cursor.fetchone()
        print(f"  {title:<36} {float(written) / n:8,.0f} bytes of WAL per job")

    due = time.time() + 3600
    count("schedule() one at a time", lambda: [adapter.schedule(f"s{i}", due) for i in range(n)])
    now = time.time()
    adapter.schedule_batch([(f"d{i}", now) for i in range(n)])
    worker = WorkerProcess(get_engine(), Options(queues=["default"], burst=True))
    count("worker, one thread draining", worker.work_loop)


if __name__ == "__main__":
    main()
