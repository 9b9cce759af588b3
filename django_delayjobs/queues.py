"""The state of every queue, as the admin, the API and ``delayjobs_stats`` show it.

Counts come from Redis (each O(log N)); only the ``retrying`` count and the rows behind
the listed ids come from the database, through indexes, so the page stays fast however
many jobs the table holds.
"""

from __future__ import annotations

import contextlib
import datetime
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count

from .conf import delayjobs_settings
from .connection import get_engine
from .engine import Engine, EngineUnavailable, QueueStats, WrongType, is_valid_name
from .engine.errors import PartlyUnavailable, PerShard, unreachable
from .engine.results import Overview
from .models import ACTIVE, Job, Status
from .rows import tolerant

#: The latest time a datetime can show (9999-12-31 23:59:59.999999 UTC).
LATEST = datetime.datetime.max.replace(tzinfo=datetime.UTC)
EARLIEST = datetime.datetime.min.replace(tzinfo=datetime.UTC)


def ms_datetime(ms: int | None) -> datetime.datetime | None:
    """A time Redis holds (ms since the epoch) as an aware datetime, or None. Redis may hold
    a time later than a datetime can show: the engine accepts due times up to 10000-01-01
    (the row of a job due at ``datetime.max`` rounds to it), and a key another program
    wrote may hold any score; such a time is shown as ``LATEST``, one before year 1 as
    ``EARLIEST``."""
    if ms is None:
        return None
    if ms >= LATEST.timestamp() * 1000:
        return LATEST
    if ms <= EARLIEST.timestamp() * 1000:
        return EARLIEST
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)


@dataclass
class ShardState:
    """One shard of a queue (a queue of 1 shard is its own), and the master that holds it
    ("" on one Redis)."""

    name: str
    master: str
    stats: QueueStats

    @property
    def next_due_at(self) -> datetime.datetime | None:
        return ms_datetime(self.stats.next_due_ms)

    def as_dict(self) -> dict[str, Any]:
        s = self.stats
        return {
            "shard": self.name,
            "master": self.master or None,
            "pending": s.pending,
            "overdue": s.overdue,
            "ready": s.ready,
            "in_flight": s.in_flight,
            "expired_leases": s.expired_leases,
            "garbage": s.garbage,
            "next_due_at": self.next_due_at,
            "oldest_lease_at": ms_datetime(s.oldest_lease_ms),
        }


@dataclass
class QueueState:
    name: str
    stats: QueueStats
    retrying: int
    next_due: list[tuple[Job | None, str, datetime.datetime | None]] = field(default_factory=list)
    workers: list[dict[str, Any]] = field(default_factory=list)
    #: Per shard; the totals above sum them.
    shards: list[ShardState] = field(default_factory=list)
    #: The latest dead jobs, when asked for (``readable_queue_states(garbage=)``).
    dead: list[tuple[Job | None, str, datetime.datetime | None]] = field(default_factory=list)
    #: Why part of the queue could not be read ("" when all of it was): the shards in
    #: ``missing`` (their masters down) are left out of the counts and lists above.
    partial: str = ""
    missing: list[str] = field(default_factory=list)

    @property
    def next_due_at(self) -> datetime.datetime | None:
        return ms_datetime(self.stats.next_due_ms)

    @property
    def oldest_lease_at(self) -> datetime.datetime | None:
        return ms_datetime(self.stats.oldest_lease_ms)

    def as_dict(self) -> dict[str, Any]:
        s = self.stats
        return {
            "queue": self.name,
            "pending": s.pending,
            "overdue": s.overdue,
            "ready": s.ready,
            "in_flight": s.in_flight,
            "expired_leases": s.expired_leases,
            "retrying": self.retrying,
            "garbage": s.garbage,
            "next_due_at": self.next_due_at,
            "oldest_lease_at": self.oldest_lease_at,
            "live_workers": s.live_workers,
            "counters": s.counters,
            "next_due": [
                {"id": job_id, "action": job.action if job else None, "run_at": due}
                for job, job_id, due in self.next_due
            ],
            "workers": [
                {**w, "expires_at": ms_datetime(w.get("expires_ms"))} for w in self.workers
            ],
            "shards": [shard.as_dict() for shard in self.shards],
            "incomplete": self.partial or None,
            "missing_shards": self.missing,
        }


def listed_queues(engine: Engine) -> tuple[set[str], str]:
    """The queues Redis lists, the default queue and those ``QUEUE_SHARDS`` names; and ""
    or, when the directory of queues cannot be read but Redis answers (on a Cluster, the
    directory's master is down; or another program's key took its name), why: the queues
    are then those it listed when this process last read it, so a queue that only Redis
    knows of may be missing, and the caller says so."""
    configured = {delayjobs_settings.DEFAULT_QUEUE, *delayjobs_settings.QUEUE_SHARDS}
    try:
        return set(engine.known_queues()) | configured, ""
    except EngineUnavailable as exc:
        if unreachable(exc) and not engine.is_cluster:
            raise  # one Redis: every queue's master is down too
        listed = set(engine.known_queues(fresh=False)) | configured
        return listed, f"the directory of queues cannot be read, so a queue may be missing: {exc}"


def queue_names(engine: Engine | None = None) -> tuple[list[str], str]:
    """Every queue Redis knows of, plus those of active jobs and the default queue; not a
    name no Redis key can carry (a row written by hand: reconcile names it). And why some
    may be missing, or "" (see ``listed_queues``)."""
    engine = engine or get_engine()
    names, unlisted = listed_queues(engine)
    # order_by(): with Meta.ordering's run_at, DISTINCT would be over (queue, run_at) and
    # return a row per active job.
    active = Job.objects.filter(status__in=ACTIVE).order_by().values_list("queue", flat=True)
    names |= set(active.distinct())
    return sorted(name for name in names if is_valid_name(name)), unlisted


def queue_state(
    name: str,
    *,
    next_due: int = 10,
    engine: Engine | None = None,
    down: dict[str, str] | None = None,
) -> QueueState:
    """Return the state of one queue; of the shards that answer if some do not (their
    masters down: ``partial`` says why). Raises ``EngineUnavailable`` if none answers.
    ``down``: as in ``Engine.stats`` (a caller reading several queues waits for a frozen
    Cluster master once)."""
    engine = engine or get_engine()
    read = _read_one(engine, name, next_due, 0, down)
    if isinstance(read, Exception):
        raise read
    return _states(engine, {name: read}, with_dead=False)[0]


def _read_one(
    engine: Engine, name: str, next_due: int, garbage: int, down: dict[str, str] | None = None
) -> Overview | EngineUnavailable:
    """One queue read call by call (``Engine.overview`` reads many in one pipeline); of
    the shards that answer if some do not (``Overview.partial`` says why). With ``down``
    (see ``Engine.stats``), a Cluster master that did not answer is not asked again."""
    each = PerShard()
    stats: QueueStats | None = each.run(lambda: engine.stats(name, down), None)  # WRONGTYPE
    if stats is None:
        assert each.failure is not None
        return each.failure  # no shard answered
    nothing: list[Any] = []
    upcoming = each.run(lambda: engine.next_due(name, next_due, down), nothing)
    dead = each.run(lambda: engine.garbage(name, garbage, down), nothing) if garbage else []
    workers = each.run(lambda: engine.workers(name, down), nothing)
    return Overview(stats, upcoming, dead, workers, str(each.failure or ""))


def _states(engine: Engine, read: dict[str, Overview], *, with_dead: bool) -> list[QueueState]:
    """The states of queues read from Redis, with their rows: one query for the rows of
    every listed id, one for the retrying counts."""
    retrying = dict(
        Job.objects.filter(queue__in=list(read), status=Status.RETRYING)
        .order_by()
        .values_list("queue")
        .annotate(n=Count("pk"))
        .values_list("queue", "n")
    )
    ids = [entries for o in read.values() for entries in (o.next_due, o.garbage)]
    rows = _rows([job_id for entries in ids for job_id, _ in entries])
    return [
        QueueState(
            name=name,
            stats=o.stats,
            retrying=retrying.get(name, 0),
            next_due=_with_rows(o.next_due, rows),
            workers=[_worker(info) for info in o.workers],
            shards=[
                ShardState(s.queue, engine.node_of(s.queue), s) for s in o.stats.shards or [o.stats]
            ],
            dead=_with_rows(o.garbage, rows) if with_dead else [],
            partial=o.partial,
            missing=missing_shards(engine, name, o.stats) if o.partial else [],
        )
        for name, o in read.items()
    ]


def missing_shards(engine: Engine, name: str, stats: QueueStats) -> list[str]:
    """The shards of a queue read in part (``stats``: of those that answered) that did
    not answer."""
    answered = {s.queue for s in stats.shards or [stats]}
    return [s for s in engine.shards(name) if s not in answered]


#: The fields of a worker's description (``WorkerProcess.heartbeat``) and their types.
_WORKER_FIELDS: dict[str, type] = {
    "host": str, "pid": int, "concurrency": int, "roles": list, "queues": list,
}  # fmt: skip


def _worker(info: dict[str, Any]) -> dict[str, Any]:
    """A live worker's description without the fields a worker never writes in that type
    (a description another program wrote): the admin and the API show them typed."""

    def fits(name: str, value: Any) -> bool:
        kind = _WORKER_FIELDS.get(name)
        if kind is list:
            return isinstance(value, list) and all(isinstance(v, str) for v in value)
        return kind is None or (isinstance(value, kind) and not isinstance(value, bool))

    return {name: value for name, value in info.items() if fits(name, value)}


def all_queue_states(*, next_due: int = 10) -> list[QueueState]:
    """Return the state of every queue (see ``queue_names``)."""
    engine = get_engine()
    names, _ = queue_names(engine)
    down: dict[str, str] = {}
    return [queue_state(name, next_due=next_due, engine=engine, down=down) for name in names]


def readable_queue_states(
    *,
    next_due: int = 10,
    garbage: int = 0,
    names: Sequence[str] | None = None,
    down: dict[str, str] | None = None,
) -> tuple[list[QueueState], dict[str, str], str]:
    """Return the state of every queue (or of ``names``) that can be read (in part:
    ``partial``), with its ``garbage`` latest dead jobs; queue -> why for the queues that
    cannot: one with a key of the wrong type (another program's), or on a Cluster master
    that does not answer, hides no other; and why a queue may be missing, or "" (see
    ``listed_queues``; always "" with ``names``). Raises ``EngineUnavailable`` if Redis is
    down (no queue could be read, and not for a wrong type).

    Redis is read in one pipeline for all the queues; on a Cluster (whose pipelines
    redis-py does not let carry the counts' script), queue by queue instead, each master
    that does not answer waited for once (``down``: as in ``Engine.stats``, for a caller
    that reads more)."""
    engine = get_engine()
    unlisted = ""
    if names is None:
        names, unlisted = queue_names(engine)
    read: dict[str, Overview | Exception]
    try:
        read = dict(engine.overview(names, next_due=next_due, garbage=max(garbage, 1)))
    except EngineUnavailable:
        if not engine.is_cluster:
            raise
        away = {} if down is None else down  # each master that does not answer: waited once
        read = {name: _read_one(engine, name, next_due, garbage, away) for name in names}
    errors = {name: str(r) for name, r in read.items() if isinstance(r, Exception)}
    found = {name: r for name, r in read.items() if not isinstance(r, Exception)}
    failure = next((r for r in read.values() if isinstance(r, Exception)
                    and not isinstance(r, WrongType)), None)  # fmt: skip
    if failure is not None and not found:
        raise failure
    return _states(engine, found, with_dead=garbage > 0), errors, unlisted


def garbage(name: str, limit: int = 100) -> list[tuple[Job | None, str, datetime.datetime | None]]:
    """Return the most recently buried jobs of a queue: (row or None, id, time of death);
    of the shards that answer, if some do not."""
    try:
        entries = get_engine().garbage(name, limit)
    except PartlyUnavailable as exc:  # its state says so (``partial``)
        entries = exc.done
    return _with_rows(entries)


def _rows(ids: Iterable[str]) -> dict[str, Job]:
    """The Job rows of ids from Redis, by id (an id that is no UUID is not one of ours)."""
    pks: dict[str, uuid.UUID] = {}
    for job_id in ids:
        with contextlib.suppress(ValueError):  # not one of ours: shown without a row
            pks[job_id] = uuid.UUID(job_id)
    rows = tolerant(Job.objects.all()).in_bulk(list(pks.values()))
    return {job_id: rows[pk] for job_id, pk in pks.items() if pk in rows}


def _with_rows(
    entries: list[tuple[str, int]], rows: dict[str, Job] | None = None
) -> list[tuple[Job | None, str, datetime.datetime | None]]:
    """Pair (id, ms) entries from Redis with their Job rows (None if there is none)."""
    rows = _rows(job_id for job_id, _ in entries) if rows is None else rows
    return [(rows.get(job_id), job_id, ms_datetime(ms)) for job_id, ms in entries]
