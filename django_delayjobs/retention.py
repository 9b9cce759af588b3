"""Retention: delete finished jobs (and their history) once they are old enough.

Used by ``manage.py delayjobs_prune`` and, with ``PRUNE_AFTER_SECONDS`` set, by every
worker's housekeeping thread (``AutoPrune``). Only finished jobs are ever deleted, and
only those whose ``finished_at`` is older than the cutoff; ``dead`` jobs are kept unless
named, since they wait for someone to requeue or purge them.

Deletion goes in batches, each in its own short transaction: select (and, where the
database can, lock, skipping locked rows) up to ``batch`` primary keys, delete their
events, then the jobs. Both deletes restate the conditions, so a job requeued between the
select and the delete is left alone on every database (and the one-by-one retry after a
refusal locks its job first, so a requeue cannot land between the two deletes). On
PostgreSQL the three are one statement; on a database without row locks (SQLite) the
select runs before the transaction, so the write lock lasts only as long as the deletes.
Rows are deleted without loading them (no ``pre_delete``/``post_delete`` signals): a row
that cannot be read back cannot stop the pruning.

A pass walks the jobs in (``finished_at``, id) order, each batch on from the last job the
one before chose: the jobs it leaves (those a model refers to, those another transaction
had locked) are read past once a pass, not by every batch.

A job another table refers to cannot be deleted (the database refuses). The jobs your
models refer to (a foreign key to ``Job``) are left out by the batch's own query; a
refusal no model explains (a table without a model, a trigger: see ``refused``) rolls its
batch back, and that batch is retried one job per transaction, the refused jobs left
behind a keyset position on (``finished_at``, id). Neither grows with the number of jobs
left: an earlier version sent every refused id back in each batch's ``NOT IN``, which
SQLite refuses past 32,766 of them.

A deleted ``dead`` job's id is then purged from its queue's Redis garbage, once the
batch's transaction has committed. Redis down or refusing does not stop the prune (the
rows are gone already): the ids it could not purge are counted in one warning at the end.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import Error as DatabaseError
from django.db import IntegrityError, connections, router, transaction
from django.db.models import ForeignKey
from django.utils import timezone

from . import sql
from .conf import delayjobs_settings
from .connection import get_engine
from .engine import MAX_BATCH as MAX_IDS
from .engine import DelayJobsError, EngineUnavailable, is_valid_name
from .models import FINISHED, Job, JobEvent, Status

if TYPE_CHECKING:
    from .engine import Engine

logger = logging.getLogger("django_delayjobs.retention")

#: Pruned unless other statuses are named: ``dead`` jobs wait for a person.
DEFAULT_STATUSES: tuple[str, ...] = (Status.SUCCEEDED, Status.CANCELLED, Status.SKIPPED)
#: ``delayjobs_prune``'s defaults: small batches at a steady pace, the shape that delayed
#: the workers' jobs least while a prune ran (docs/performance.md).
DEFAULT_BATCH = 50
DEFAULT_RATE = 1000
MAX_BATCH = 10_000
#: The highest ``delayjobs_prune --max-rate`` (jobs/s; 0: unpaced).
MAX_RATE = 1_000_000
#: The longest ``--older-than`` (a cutoff before year 1 would not be a date).
MAX_AGE = datetime.timedelta(days=36_500)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
_DURATION = re.compile(r"([0-9]{1,12})([smhd])")

#: Automatic pruning: the command's batches and pace, at most ``AUTO_BATCHES`` batches per
#: housekeeping step (about one a second: 250 jobs/s, 21 million a day), and the longest
#: time between two passes.
AUTO_BATCH = DEFAULT_BATCH
AUTO_BATCHES = 5
AUTO_EVERY_SECONDS = 3600.0
#: After a failed batch (database or Redis down), the automatic pass waits this long.
AUTO_RETRY_SECONDS = 60.0


def parse_duration(text: str) -> datetime.timedelta:
    """``30d``, ``12h``, ``90m`` or ``3600s`` as a timedelta; ValueError for anything else."""
    match = _DURATION.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(
            f"{text!r} is not a duration: give a whole number and a unit, "
            "e.g. 30d, 12h, 90m or 3600s"
        )
    seconds = int(match[1]) * _UNITS[match[2]]
    if seconds == 0:
        raise ValueError("the duration must be more than 0 (0 would prune jobs just finished)")
    if seconds > MAX_AGE.total_seconds():
        raise ValueError(f"{text!r} is too long: at most {MAX_AGE.days}d")
    return datetime.timedelta(seconds=seconds)


def parse_statuses(text: str) -> tuple[str, ...]:
    """A comma-separated list of finished statuses; ValueError for any other."""
    if not isinstance(text, str):  # call_command(status=[...]): not the list it looks like
        raise ValueError(f"{text!r} is not a comma-separated list of statuses")
    return check_statuses(s.strip() for s in text.split(",") if s.strip())


def check_statuses(statuses: Iterable[str]) -> tuple[str, ...]:
    """Finished statuses, each once; ValueError for none, or any other (a job that can
    still run is never pruned, whoever asks)."""
    names = tuple(dict.fromkeys(statuses))
    if not names:
        raise ValueError("no status given")
    finished = [s.value for s in FINISHED]
    for name in names:
        if name not in finished:
            raise ValueError(
                f"{name!r} is not a finished status: only {', '.join(finished)} jobs are pruned"
            )
    return names


def check_rate(value: int) -> int | None:
    """A ``--max-rate`` in jobs/s; 0 (unpaced) as None."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RATE:
        raise ValueError(f"the rate must be from 0 to {MAX_RATE} jobs/s, not {value!r}")
    return value or None


def check_batch(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BATCH:
        raise ValueError(f"the batch size must be from 1 to {MAX_BATCH}, not {value!r}")
    return value


#: A keyset position on (``finished_at``, id), as the database holds them (see ``sql``).
Cursor = sql.Position


def references(alias: str) -> list[ForeignKey[Any, Any]]:
    """The foreign keys of models on database ``alias`` whose constraint refuses to delete
    a job they refer to (``PROTECT``, but also ``CASCADE`` & co: the prune deletes without
    Django's collector); not the events', which the prune deletes first, nor one whose
    database cascades itself (Django 6's ``DB_CASCADE`` & co)."""
    found = []
    for rel in Job._meta.get_fields(include_hidden=True):
        field = getattr(rel, "field", None)
        if not (rel.auto_created and not rel.concrete and isinstance(field, ForeignKey)):
            continue
        model = field.model
        if model is JobEvent or not getattr(field, "db_constraint", True):
            continue
        if hasattr(field.remote_field.on_delete, "on_delete_sql"):  # the database's action
            continue
        if router.allow_migrate_model(alias, model):  # else no table of it on ``alias``
            found.append(field)
    return found


@dataclass
class Pruned:
    """What a prune deleted (or, in a dry run, would delete)."""

    jobs: int = 0
    events: int = 0
    batches: int = 0
    #: A batch's deleted dead jobs, (queue, id): ids their queue's Redis garbage holds.
    dead: list[tuple[str, str]] = field(default_factory=list)
    #: Jobs left because another table refers to them (see ``Protected``).
    protected: int = 0
    #: Whether the prune went to the end: no job it may delete is left.
    complete: bool = False
    #: The last job a batch chose (deleted, or found refused): the next batch's start.
    last: Cursor | None = None
    #: The jobs a batch chose: deleted, refused, or changed since (requeued, on a database
    #: without row locks). Fewer than its size: none is left.
    chosen: int = 0


def count(cutoff: datetime.datetime, statuses: Sequence[str]) -> Pruned:
    """What ``prune`` would delete now (a dry run)."""
    statuses = check_statuses(statuses)
    jobs, events = sql.count_finished(cutoff, statuses, _referenced_sql())
    return Pruned(jobs=jobs, events=events)


def delete_batch(
    cutoff: datetime.datetime, statuses: Sequence[str], size: int, after: Cursor | None = None
) -> Pruned:
    """Delete up to ``size`` of the oldest matching jobs (past ``after``, and that no
    model refers to) and their events, in one transaction."""
    alias = sql.db()
    conn = connections[alias]
    if conn.vendor == "postgresql":
        return _delete_batch_postgresql(cutoff, statuses, size, after)
    # Without row locks (SQLite) the batch is chosen before the transaction, whose write
    # lock then waits for no read past the jobs left (_delete restates the conditions).
    lock = conn.features.has_select_for_update
    with transaction.atomic(using=alias) if lock else contextlib.nullcontext():
        rows = sql.choose_finished(cutoff, statuses, size, after, _referenced_sql(), lock=lock)
        if not rows:
            return Pruned()
        with transaction.atomic(using=alias, savepoint=False):
            done = _delete(alias, cutoff, statuses, [pk for _, pk in rows])
    done.last, done.chosen = rows[-1], len(rows)
    return done


def _delete(
    alias: str,
    cutoff: datetime.datetime,
    statuses: Sequence[str],
    pks: list[Any],
    *,
    lock: bool = False,
) -> Pruned:
    """Delete the jobs ``pks`` that still match, and their events (in the caller's
    transaction; ``lock``: the jobs are not locked yet, lock them first where the database
    can)."""
    # Restated: on a database without row locks a job may have been requeued since. As
    # "not another status", which SQLite reads by primary key: it reads "status IN (...)"
    # through the (status, run_at) index, i.e. every finished job, kept ones too.
    others = [s for s in Status.values if s not in statuses]
    still = (Job.objects.using(alias).filter(pk__in=pks, finished_at__lt=cutoff)
             .exclude(status__in=others))  # fmt: skip
    features = connections[alias].features
    if lock and features.has_select_for_update:
        # Else each statement reads the rows afresh (READ COMMITTED): a requeue committed
        # between the events' delete and the job's left the job waiting again, its
        # history gone. Locked, a requeue waits for this transaction, or came first. A
        # job another transaction holds is skipped, as a batch skips it: the next run
        # prunes it, and this one (a worker's database thread) does not wait for it.
        skip = features.has_select_for_update_skip_locked
        locked = list(still.select_for_update(skip_locked=skip).values_list("pk", flat=True))
        if not locked:
            return Pruned(batches=1)
        still = still.filter(pk__in=locked)
    # A write first: on SQLite a transaction that began (DEFERRED, Django's default) with a
    # read cannot then write once another connection has committed ("database is locked"
    # at once, whatever the busy timeout); a write first waits for the lock instead.
    events = JobEvent.objects.using(alias).filter(job__in=still.values("pk"))
    deleted_events = events._raw_delete(alias)
    dead = []
    if Status.DEAD in statuses:
        dead = [(q, str(pk)) for q, pk, status in still.values_list("queue", "pk", "status")
                if status == Status.DEAD]  # fmt: skip
    deleted_jobs = still._raw_delete(alias)
    return Pruned(jobs=deleted_jobs, events=deleted_events, batches=1, dead=dead)


def _referenced_sql() -> str:
    """``references()`` as SQL conditions on the job table."""
    alias = sql.db()
    return sql.unreferenced_sql(alias, references(alias))


def _delete_batch_postgresql(
    cutoff: datetime.datetime, statuses: Sequence[str], size: int, after: Cursor | None
) -> Pruned:
    """The batch as one statement: the rows are chosen, locked (locked ones skipped) and
    deleted with their events by the server, which returns the dead ones' queues and ids.
    Sending the keys through Python and back cost the command about 3 s of CPU per
    100,000 jobs, on cores that the workers share, and made the prune 2.3 times slower
    (docs/performance.md)."""
    with transaction.atomic(using=sql.db()):
        jobs, events, dead, last = sql.prune_batch(cutoff, statuses, size, after,
                                                   _referenced_sql())  # fmt: skip
    if last is None:
        return Pruned()
    # Each chosen job was locked, so deleted.
    return Pruned(jobs=jobs, events=events, batches=1, dead=dead, last=last, chosen=jobs)


class Protected:
    """Finished jobs that another table refers to, so the database refuses their delete:
    a refusal, not an outage. They are left and skipped, the rest are pruned, and what
    blocks them is logged once (again only when more are found).

    Those a model refers to (``references``) are left out by each batch's query and
    counted when a prune is done. Those the database refuses for another reason are
    found one job at a time and left behind ``after``, a keyset position: a walk in
    (``finished_at``, id) order deletes or refuses each job it meets, so every job still
    there up to ``after`` is one it refused. The state is a count and one position,
    whatever the number of jobs left, and an ``AutoPrune`` keeps it across its passes (for
    a day), so that a refused job is not tried again by every pass (a later finish is past
    it).

    ``walked`` is how far the pass under way has gone (the last job a batch chose): its
    next batch starts there, and the next pass at ``after``.
    """

    def __init__(self) -> None:
        self.after: Cursor | None = None
        self.walked: Cursor | None = None
        self.refused = 0  # jobs the database refused, since this object was made
        self.referenced = 0  # jobs a model refers to, when the last prune was done
        self.models: list[str] = []
        self.error = ""
        self._reported = 0

    @property
    def position(self) -> Cursor | None:
        """Where the next batch starts."""
        return max((p for p in (self.walked, self.after) if p is not None), default=None)

    def refuse(self, position: Cursor, exc: DatabaseError) -> None:
        self.after = position
        self.refused += 1
        self.error = str(exc).strip() or type(exc).__name__

    def count_referenced(self, cutoff: datetime.datetime, statuses: Sequence[str]) -> int:
        """Count the jobs that a model's row refers to, which the prune left."""
        alias = sql.db()
        fields = references(alias)
        self.models = [f"{f.model._meta.label}.{f.name}" for f in fields]
        referenced = sql.unreferenced_sql(alias, fields)
        self.referenced = sql.count_referenced(cutoff, statuses, referenced) if fields else 0
        return self.referenced

    def report(self) -> None:
        total = self.refused + self.referenced
        if total <= self._reported:
            return
        self._reported = total
        why = []
        if self.referenced:
            why.append(f"referred to by {', '.join(self.models)}")
        if self.refused:
            why.append(f"the database refused their delete: {self.error}")
        logger.warning(
            "pruning left %d job(s) that another table refers to (%s); the other jobs are "
            "pruned", total, "; ".join(why),
        )  # fmt: skip


def refused(exc: DatabaseError) -> bool:
    """Whether the database refused to delete a row (a constraint, a user's trigger), as
    opposed to failing."""
    # A PL/pgSQL RAISE (SQLSTATE class P0), which Django reports as a ProgrammingError.
    sqlstate = getattr(exc.__cause__, "sqlstate", None) or ""
    return isinstance(exc, IntegrityError) or sqlstate.startswith("P0")


def delete_singly(
    cutoff: datetime.datetime,
    statuses: Sequence[str],
    size: int,
    protected: Protected,
    done: Pruned,
) -> None:
    """The batch ``delete_batch`` could not delete as a whole (the database ``refused`` it:
    a row another table refers to, a trigger), one job per transaction, in (``finished_at``, id)
    order from ``protected.position``: those it refuses are left behind
    ``protected.after``. Only after such a refusal, so the usual batch stays one
    statement. What it deletes is added to ``done`` as each job's transaction commits: if
    the database fails part-way, the caller still has the jobs already deleted (their
    count, their dead ids) when the error goes on."""
    alias = sql.db()
    rows = sql.choose_finished(cutoff, statuses, size, protected.position,
                               _referenced_sql(), lock=False)  # fmt: skip
    done.chosen = len(rows)
    for position in rows:
        try:  # a transaction each: a deferred constraint refuses at COMMIT
            with transaction.atomic(using=alias):
                one = _delete(alias, cutoff, statuses, [position[1]], lock=True)
        except DatabaseError as exc:
            if not refused(exc):
                raise
            protected.refuse(position, exc)
            done.protected += 1
        else:
            done.jobs += one.jobs
            done.events += one.events
            done.dead += one.dead
        done.last = position  # not a failed one's: the next batch tries it again


def prune(
    cutoff: datetime.datetime,
    statuses: Sequence[str] = DEFAULT_STATUSES,
    *,
    batch: int = DEFAULT_BATCH,
    max_rate: int | None = None,
    max_batches: int | None = None,
    progress: Callable[[Pruned], None] | None = None,
    protected: Protected | None = None,
    stop: threading.Event | None = None,
) -> Pruned:
    """Delete every finished job of ``statuses`` that finished before ``cutoff``, batch
    by batch (``max_batches`` at most); call ``progress`` with the running totals after
    each batch. ``complete`` in the result: none is left.

    ``max_rate`` (jobs/s): after each batch, wait until that batch took at least as long
    as its jobs take at that rate, so that the CPU, the WAL and the I/O of the deletes
    (and a replica's replay of them) are spread out. A slow batch (the database busy, or
    the process stopped) is not made up for by running faster afterwards.

    The deleted dead jobs' ids are purged from Redis's garbage after each batch; those
    Redis did not take (down or refusing) are counted in one warning, and never raise.
    Jobs another table refers to are left (see ``Protected``; counted in one warning and,
    once none is left to delete, in ``protected``), and the others pruned.

    ``stop`` set (a signal, by ``delayjobs_prune``): the prune returns after the batch
    under way, its dead ids purged, and without the rest of a pause.
    """
    statuses = check_statuses(statuses)
    check_batch(batch)
    rate = None if max_rate is None else check_rate(max_rate)
    if max_batches is not None and (
        isinstance(max_batches, bool) or not isinstance(max_batches, int) or max_batches < 1
    ):
        raise ValueError(f"max_batches must be None or an int of at least 1, not {max_batches!r}")
    total = Pruned()
    garbage = GarbagePurge()
    protected = Protected() if protected is None else protected
    stop = threading.Event() if stop is None else stop

    def add(done: Pruned) -> None:
        if done.last is not None:
            protected.walked = done.last
        if done.batches:
            garbage.purge(done.dead)
            total.jobs += done.jobs
            total.events += done.events
            total.protected += done.protected
            total.batches += 1
            if progress is not None:
                progress(total)

    try:
        while True:
            started = time.monotonic()
            try:
                done = delete_batch(cutoff, statuses, batch, protected.position)
            except DatabaseError as exc:  # a row it refuses to delete: the rest, one by one
                if not refused(exc):
                    raise
                done = Pruned(batches=1)
                try:
                    delete_singly(cutoff, statuses, batch, protected, done)
                except DatabaseError:  # what it deleted before is counted, and purged
                    if done.last is not None:  # else it tried none: no batch
                        add(done)
                    raise
            add(done)
            if done.chosen < batch:  # none left
                total.protected += protected.count_referenced(cutoff, statuses)
                total.complete = True
                protected.walked = None  # the next pass starts again at the oldest
                return total
            if total.batches == max_batches or stop.is_set():
                return total
            if rate is not None and stop.wait(started + done.jobs / rate - time.monotonic()):
                return total
    finally:
        garbage.report()
        protected.report()


class GarbagePurge:
    """Purges a prune's deleted dead jobs from Redis's garbage, where the health check,
    the metrics and the admin would count them for ever; counts the ids it could not."""

    def __init__(self) -> None:
        self.left = 0
        self.error: DelayJobsError | None = None  # the first failure, for the warning
        self.failed: set[str] = set()  # queues not asked again (a dead master's waits)
        self.one_server = True

    def purge(self, dead: Iterable[tuple[str, str]]) -> None:
        by_queue: dict[str, list[str]] = defaultdict(list)
        for queue, job_id in dead:
            by_queue[queue].append(job_id)
        for queue, ids in by_queue.items():
            if not is_valid_name(queue):
                continue  # a row written by hand: no Redis key holds its id
            for start in range(0, len(ids), MAX_IDS):
                part = ids[start : start + MAX_IDS]
                if not self.purged(queue, part):
                    self.left += len(part)

    def purged(self, queue: str, ids: list[str]) -> bool:
        # One failure per prune on one Redis: no more waits on a dead one. On a Cluster,
        # one per queue: the queues of the masters that answer are purged all the same.
        if queue in self.failed or (self.error is not None and self.one_server):
            return False
        try:
            engine = get_engine()
            self.one_server = not engine.is_cluster
            engine.purge(queue, ids)  # looks in every shard of the queue
        except DelayJobsError as exc:  # Redis down or refusing, or no client (settings)
            self.error = self.error or exc
            self.failed.add(queue)
            return False
        return True

    def report(self) -> None:
        if self.left:
            logger.warning(
                "pruning left %d deleted dead job id(s) in the Redis garbage (%s): they "
                "count as garbage until purged, see docs/operations.md#retention",
                self.left, self.error,
            )  # fmt: skip


class AutoPrune:
    """The workers' automatic pruning (``PRUNE_AFTER_SECONDS``), a few batches per
    ``step()``.

    A pass starts at most once per ``every`` seconds across every worker process of the
    deployment: the process that sets the Redis key ``{PREFIX}:turn:prune`` (SET NX PX)
    runs it, ``batches`` batches per call of ``step()`` (the database's housekeeping
    thread calls it about once a second, apart from the lease extensions and heartbeats,
    which a slow delete must not hold up) at ``delayjobs_prune``'s pace. A failure is
    logged once, the pass goes on ``AUTO_RETRY_SECONDS`` later, and ``step()`` never
    raises.

    The jobs the database refused are skipped by later passes (see ``Protected``) for
    ``refused_kept_for`` seconds; the first pass after that tries them again, since
    what kept them (a row referring to them) may be gone, and warns again of those still
    refused.
    """

    #: How long refused jobs are skipped: trying them costs a statement each.
    refused_kept_for = 86_400.0

    def __init__(self, engine: Engine, every: float | None = None,
                 batch: int = AUTO_BATCH, batches: int = AUTO_BATCHES) -> None:  # fmt: skip
        self.engine = engine
        self.every = every
        self.batch = batch
        self.batches = batches
        self.cutoff: datetime.datetime | None = None  # set while a pass is under way
        self.protected = Protected()  # its refused jobs: skipped by the passes ...
        self.protected_since = time.monotonic()  # ... until refused_kept_for after this
        self.next_try = 0.0  # time.monotonic() of the next step that does anything
        self.failing = False

    def step(self) -> Pruned | None:
        """Do the next bit of work if any is due; return what its batches deleted."""
        after = delayjobs_settings.PRUNE_AFTER_SECONDS
        if after is None or time.monotonic() < self.next_try:
            return None
        every = self.every if self.every is not None else min(after, AUTO_EVERY_SECONDS)
        try:
            if self.cutoff is None and not self.take_turn(every):
                return None
            assert self.cutoff is not None
            done = prune(self.cutoff, batch=self.batch, max_rate=DEFAULT_RATE,
                         max_batches=self.batches, protected=self.protected)  # fmt: skip
        except (DatabaseError, EngineUnavailable) as exc:
            self.failed(exc)
            return None
        except Exception as exc:  # a bug here must not kill the housekeeping thread
            logger.exception("automatic pruning failed")
            self.failed(exc)
            return None
        finally:
            sql.close_stale()
        if done.jobs:
            logger.info("automatic pruning: deleted %d job(s) and %d event(s)", done.jobs,
                        done.events)  # fmt: skip
        if self.failing:
            logger.warning("automatic pruning works again")
            self.failing = False
        if done.complete:  # this pass is over
            self.cutoff = None
            self.next_try = time.monotonic() + every
        return done

    def take_turn(self, every: float) -> bool:
        """Whether this process runs the pass that is due (one per ``every`` seconds)."""
        wait_ms = self.engine.take_turn("prune", every * 1000)
        if wait_ms:  # another process runs this interval's pass
            self.next_try = time.monotonic() + min(wait_ms / 1000, every)
            return False
        after = delayjobs_settings.PRUNE_AFTER_SECONDS or 0
        self.cutoff = timezone.now() - datetime.timedelta(seconds=after)
        if time.monotonic() - self.protected_since >= self.refused_kept_for:
            self.protected, self.protected_since = Protected(), time.monotonic()
        return True

    def failed(self, exc: BaseException) -> None:
        if not self.failing:
            logger.warning("automatic pruning failed (%s); trying again every %.0f s",
                           exc, AUTO_RETRY_SECONDS)  # fmt: skip
            self.failing = True
        self.next_try = time.monotonic() + AUTO_RETRY_SECONDS
