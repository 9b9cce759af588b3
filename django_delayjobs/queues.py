"""The state of every queue, as the admin, the API and ``delayjobs_stats`` show it.

Counts come from Redis (each O(log N)); only the ``retrying`` count and the rows behind
the listed ids come from the database, through indexes, so the page stays fast however
many jobs the table holds.
"""

from __future__ import annotations

import contextlib
import datetime
import uuid
from dataclasses import dataclass, field
from typing import Any

from .conf import delayjobs_settings
from .connection import get_engine
from .engine import Engine, EngineUnavailable, QueueStats, WrongType, is_valid_name
from .engine.errors import PartlyUnavailable, PerShard, unreachable
from .models import ACTIVE, Job, Status
from .rows import tolerant

#: The latest time a datetime can show (9999-12-31 23:59:59.999999 UTC).
LATEST = datetime.datetime.max.replace(tzinfo=datetime.UTC)


def ms_datetime(ms: int | None) -> datetime.datetime | None:
    """A time Redis holds (ms since the epoch) as an aware datetime, or None. Redis may hold
    a time later than a datetime can show: the engine accepts due times up to 10000-01-01
    (the row of a job due at ``datetime.max`` rounds to it), and a key another program
    wrote may hold any score; such a time is shown as ``LATEST``."""
    if ms is None:
        return None
    if ms >= LATEST.timestamp() * 1000:
        return LATEST
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


def queue_state(name: str, *, next_due: int = 10, engine: Engine | None = None) -> QueueState:
    """Return the state of one queue; of the shards that answer if some do not (their
    masters down: ``partial`` says why). Raises ``EngineUnavailable`` if none answers."""
    engine = engine or get_engine()
    each = PerShard()
    stats: QueueStats | None = each.run(lambda: engine.stats(name), None)  # names a WRONGTYPE
    if stats is None:
        each.check()  # raises: no shard answered
    assert stats is not None
    nothing: list[Any] = []
    upcoming = each.run(lambda: engine.next_due(name, next_due), nothing)
    workers = each.run(lambda: engine.workers(name), nothing)
    answered = {s.queue for s in stats.shards or [stats]}
    return QueueState(
        name=name,
        stats=stats,
        retrying=Job.objects.filter(queue=name, status=Status.RETRYING).count(),
        next_due=_with_rows(upcoming),
        workers=[_worker(info) for info in workers],
        shards=[ShardState(s.queue, engine.node_of(s.queue), s) for s in stats.shards or [stats]],
        partial=str(each.failure or ""),
        missing=[s for s in engine.shards(name) if each.failure and s not in answered],
    )


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
    return [queue_state(name, next_due=next_due, engine=engine) for name in names]


def readable_queue_states(*, next_due: int = 10) -> tuple[list[QueueState], dict[str, str], str]:
    """Return the state of every queue that can be read (in part: ``partial``), queue ->
    why for the queues that cannot: one with a key of the wrong type (another program's),
    or on a Cluster master that does not answer, hides no other; and why a queue may be
    missing, or "" (see ``listed_queues``). Raises ``EngineUnavailable`` if Redis is down
    (no queue could be read, and not for a wrong type)."""
    engine = get_engine()
    states, errors = [], {}
    down: EngineUnavailable | None = None
    names, unlisted = queue_names(engine)
    for name in names:
        try:
            states.append(queue_state(name, next_due=next_due, engine=engine))
        except EngineUnavailable as exc:
            errors[name] = str(exc)
            down = down or (None if isinstance(exc, WrongType) else exc)
    if down is not None and not states:
        raise down
    return states, errors, unlisted


def garbage(name: str, limit: int = 100) -> list[tuple[Job | None, str, datetime.datetime | None]]:
    """Return the most recently buried jobs of a queue: (row or None, id, time of death);
    of the shards that answer, if some do not."""
    try:
        entries = get_engine().garbage(name, limit)
    except PartlyUnavailable as exc:  # its state says so (``partial``)
        entries = exc.done
    return _with_rows(entries)


def _with_rows(
    entries: list[tuple[str, int]],
) -> list[tuple[Job | None, str, datetime.datetime | None]]:
    """Pair (id, ms) entries from Redis with their Job rows (None if there is none)."""
    pks: dict[str, uuid.UUID] = {}
    for job_id, _ in entries:
        with contextlib.suppress(ValueError):  # not one of ours: shown without a row
            pks[job_id] = uuid.UUID(job_id)
    rows = tolerant(Job.objects.all()).in_bulk(list(pks.values()))
    return [(rows.get(pks.get(job_id)), job_id, ms_datetime(ms)) for job_id, ms in entries]
