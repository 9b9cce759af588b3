"""delayjobs: ``schedule(at=...)`` / ``schedule_many`` in-process; ``manage.py run_delayworker``."""

from __future__ import annotations

import datetime
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import django

from peers import common


@contextmanager
def private_environment(name: str, database_url: str | None) -> Iterator[Path]:
    """For a bench run in this process: a private ``redis-server`` and a SQLite file
    (or ``database_url``) named where ``dj_settings`` looks; yields the work directory."""
    from django_delayjobs.embedded import EmbeddedRedis

    workdir = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    server = EmbeddedRedis(workdir / "redis")
    try:
        os.environ["BENCH_REDIS_URL"] = server.start()
        os.environ["BENCH_SQLITE_PATH"] = str(workdir / f"{name}.sqlite3")
        if database_url:
            os.environ["BENCH_DATABASE_URL"] = database_url
        yield workdir
    finally:
        server.close()


class Adapter(common.Adapter):
    name = "delayjobs"
    packages = ("django-delayjobs", "Django", "redis")
    has_batch = True
    scales = True

    def __init__(self) -> None:
        os.environ["DJANGO_SETTINGS_MODULE"] = "peers.dj_settings"
        django.setup()
        from django.core.management import call_command
        from django.db import connection

        from django_delayjobs.conf import delayjobs_settings

        call_command("migrate", verbosity=0)
        self.db = connection.vendor
        if self.db == "postgresql":
            self.packages = (*self.packages, "psycopg")
        if self.db == "sqlite":
            audit = "SQLite, journal_mode=WAL, synchronous=NORMAL"
        else:
            with connection.cursor() as cursor:
                cursor.execute("SHOW server_version")
                (server,) = cursor.fetchone()
                cursor.execute("SHOW synchronous_commit")
                (sync,) = cursor.fetchone()
            audit = f"{self.db} {server}, synchronous_commit={sync}"
            if os.environ.get("BENCH_DATABASE_OPTIONS"):  # dj_settings adds them
                audit += f", OPTIONS {os.environ['BENCH_DATABASE_OPTIONS']}"
        tuning = ", ".join(
            f"{name} {getattr(delayjobs_settings, name)}"
            for name in ("TICK_SECONDS", "BATCH_SIZE", "PREFETCH")
        )
        self.settings = {
            "client": "schedule(record, at=due, args=...); batch: schedule_many(build_job(...))"
            " in chunks of 1000, one transaction each",
            "audit rows": audit + "; Django default CONN_MAX_AGE 0",
            "worker": "python -m django run_delayworker (promoter + 1 worker thread; W5: "
            "--concurrency 2 and 4, and 2 processes)",
            "DELAYJOBS": f"defaults ({tuning})",
        }

    def worker_cmd(self, concurrency: int = 1) -> list[str]:
        command = [sys.executable, "-m", "django", "run_delayworker", "-v", "0"]
        return command + (["--concurrency", str(concurrency)] if concurrency != 1 else [])

    def live_workers(self) -> int:
        """Worker processes with a live heartbeat (each sends one as it starts)."""
        from django_delayjobs.conf import delayjobs_settings
        from django_delayjobs.connection import get_engine

        return len(get_engine().workers(delayjobs_settings.DEFAULT_QUEUE))

    def _at(self, due: float) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(due, datetime.UTC)

    def schedule(self, job_id: str, due: float) -> None:
        from django_delayjobs import schedule
        from peers.djapp.models import record

        schedule(record, at=self._at(due), args=[job_id, due])

    def schedule_batch(self, items: list[tuple[str, float]]) -> None:
        from django_delayjobs.services import build_job, schedule_many
        from peers.djapp.models import record

        for start in range(0, len(items), 1000):
            schedule_many(
                build_job(record, at=self._at(due), args=[job_id, due])
                for job_id, due in items[start : start + 1000]
            )

    def reset(self) -> None:
        from django.db import connection

        from django_delayjobs.models import Job, JobEvent

        with connection.cursor() as cursor:
            for model in (JobEvent, Job):
                cursor.execute(f"DELETE FROM {model._meta.db_table}")
