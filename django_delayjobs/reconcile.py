"""Repair Redis from the database: every waiting job must be held by the engine.

Redis may lose everything (a restart without persistence, FLUSHALL, failover) or miss an
add (it was down when a schedule committed). The database is the record, so this sweep
re-adds what Redis does not hold. Adding is idempotent, so sweeps may overlap.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterator
from datetime import datetime, timedelta
from functools import partial
from typing import Any, cast

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import (
    BinaryField,
    Case,
    DateTimeField,
    Field,
    Func,
    TextField,
    UUIDField,
    Value,
    When,
)
from django.db.models.functions import Cast
from django.utils import timezone

from . import timing
from .conf import delayjobs_settings
from .engine import (
    PRIORITY_RANGE,
    Added,
    Engine,
    EngineUnavailable,
    PartlyUnavailable,
    PerShard,
    validate_name,
)
from .engine.errors import unreachable
from .models import ACTIVE, WAITING, Job, Status
from .outcomes import follow_row
from .rows import parse_time

logger = logging.getLogger("django_delayjobs.reconcile")

CHUNK = 1000
#: The rows of one due time left after a full page are read this many at a time (see
#: ``_pages``): the (status, run_at) index holds no id, so each such read fetches and sorts
#: the whole group of that due time, and pieces of CHUNK rows made a large group (orders
#: scheduled at midnight) cost its size squared over CHUNK rows per sweep.
TIES = 50_000
#: A row this young may be one whose transaction has just committed and whose id is on
#: its way to Redis (the on-commit add of its own process): it is re-added like any other
#: but not counted as lost, so that a busy system logs no false repairs.
FRESH = timedelta(seconds=10)


class Reconciled(Counter[str]):
    """Jobs re-added per queue; ``unusable``: rows whose due time cannot be used (poison
    rows: id -> why), handed to a worker due now; ``skipped``: rows no worker can claim,
    whose id is not a job id (or not in the form the database keeps), whose queue cannot
    name Redis keys, or whose text is not UTF-8; ``cleared`` (a full
    pass only): ids taken out of a queue's garbage whose job is not dead."""

    def __init__(self) -> None:
        super().__init__()
        self.unusable: dict[str, str] = {}
        self.skipped: dict[str, str] = {}
        self.cleared: Counter[str] = Counter()

    def __bool__(self) -> bool:
        """Whether anything was done or found (a report would not be empty)."""
        return bool(len(self) or self.unusable or self.skipped or +self.cleared)


def reconcile(engine: Engine, *, horizon: timedelta | None = None,
              ids: Collection[str] | None = None,
              progress: Callable[[], None] = lambda: None,
              into: Reconciled | None = None) -> Reconciled:  # fmt: skip
    """Re-add waiting jobs due within ``horizon`` (all of them when None), of ``ids`` only
    if given; count per queue (in ``into`` if given: what was repaired before a database
    error stopped the sweep); call ``progress`` at each row read (the worker's watchdog: a
    long sweep is no stuck one).

    A ``running`` job Redis holds nowhere (it lost its data while the job ran), or only in
    garbage (it was restored from a snapshot taken while the job was dead, before a retry),
    is put back in flight with a new lease (``adopt``), not in ready: its worker, if it
    still runs it, extends that lease, so no second worker runs it meanwhile; if its worker
    is gone too, the lease ends and the job is delivered again.
    A waiting job whose id is in garbage (a requeue whose own Redis step was lost) is
    requeued only if the id was buried before its row was read (``_clock``): one whose job
    ran and died since stays there, where its row says it is.
    A job created less than ``FRESH`` ago is re-added if Redis lacks it, but not counted.
    A job Redis holds pending is moved only to an earlier due time: the one read here may
    be older than one a ``reschedule`` committed since has given Redis (a job handed over
    too early is deferred by the worker to its row's due time).
    On one Redis, Redis is asked its time first: while it is down no row is read (the
    sweep is retried every few seconds). The rows are read a page at a time (``_pages``),
    so each is acted on as it is then, not as it was when the sweep began.
    A shard whose master cannot be reached does not stop the sweep: every other one is
    repaired, then ``PartlyUnavailable`` is raised with the result as ``done``. A queue
    none of whose shards answered (on one Redis that does not answer: every queue) is left
    for the next sweep after that chunk.

    A row whose due time cannot be used (a time before 1970, one PostgreSQL holds but
    Python cannot represent, text SQLite cannot parse) must never stop the repair of the
    others, nor wait forever: it is handed to Redis due now, counted in ``unusable`` and
    named in one log line. The worker then runs it if its row reads back (a job due in
    1969 is overdue), or settles it dead with the reason. Ids and due times are read as
    text, which cannot fail, and converted here, row by row. A row Redis cannot hold at
    all, or no worker could claim (see ``_texts``), is left out, counted in ``skipped``
    and named in one log line.

    A full pass (``horizon`` and ``ids`` None) also reads every queue's garbage: an id
    whose job finished other than dead, or whose row is gone, is taken out of it (a Redis
    restored from an older snapshot holds the dead of then, and the admin would show them
    dead).

    After a queue's shard count changed (``QUEUE_SHARDS``), a job still waiting in a shard
    of the old count is moved to its shard under the new one: taken out of the old shard,
    then added to its own (``Engine.add``). The old shards are served meanwhile, so a job
    is never stranded; a full pass (``delayjobs_reconcile``) moves every waiting job at once.
    """
    # On one Redis, one cheap call first (Redis's clock): while Redis is down (a sweep is
    # retried every few seconds) no row is read, and a frozen Redis costs this one timeout.
    clock = _clock(engine)
    result = Reconciled() if into is None else into
    moved: Counter[str] = Counter()  # ids moved to their shard under a new count
    priorities: dict[str, int] = {}  # of the batched ids whose priority is not 0
    young: set[str] = set()  # batched ids of rows created within FRESH
    running: set[str] = set()  # batched ids of running rows
    # A queue or shard whose master is down does not stop the sweep; one Redis down does.
    each = PerShard(one_server=not engine.is_cluster)
    down: set[str | None] = set()  # queues no shard of which answered (None: every queue)

    def repair(queue: str, items: dict[str, float], since: int) -> None:
        """Repair one chunk of ``queue``, whose first row was read at ``since``. Once none
        of its shards answered, the queue's other chunks (every queue's, on one Redis) are
        left for the next sweep: each would wait out the same timeouts, and a full pass of
        a frozen Redis would hang."""
        if None in down or queue in down:
            for id_ in items:
                priorities.pop(id_, None)
            young.difference_update(items)
            running.difference_update(items)
            return
        with each.attempt():
            try:
                result[queue] += _repair(engine, queue, items, priorities, young, running,
                                         moved, since)  # fmt: skip
            except PartlyUnavailable as exc:
                result[queue] += exc.done
                raise
            except EngineUnavailable as exc:  # on a Cluster, other queues' masters may answer
                down.add(None if unreachable(exc) and not engine.is_cluster else queue)
                raise

    # Each queue's rows are kept across pages and repaired CHUNK at a time: repaired per
    # page, rows of many queues interleaved by due time cost a round of calls per queue
    # per page.
    batches: dict[str, dict[str, float]] = defaultdict(dict)
    read_at: dict[str, int] = {}  # per batch: when its first row was read (see ``_clock``)
    for page, conn, page_read_at in _pages(timezone.now(), horizon, ids, clock):
        for raw_id, raw_queue, raw_run_at, priority, status, is_young, kind in page:
            progress()
            try:
                job_id, queue, run_at = _texts(raw_id, raw_queue, raw_run_at, kind, conn,
                                               status != Status.RUNNING)  # fmt: skip
            except _Skipped as exc:
                result.skipped[exc.key] = str(exc)
                continue
            batch = batches[queue]
            read_at.setdefault(queue, page_read_at)
            try:
                batch[job_id] = timing.to_ms(parse_time(run_at, conn))
            except (ArithmeticError, ValueError) as exc:
                if status != Status.RUNNING:  # a running one goes back in flight as it is
                    result.unusable[job_id] = str(exc)
                batch[job_id] = 0  # due now: the worker runs it or settles it dead
            if rank := _rank(priority):
                priorities[job_id] = rank
            if is_young:
                young.add(job_id)
            if status == Status.RUNNING:
                running.add(job_id)
            if len(batch) >= CHUNK:
                repair(queue, batches.pop(queue), read_at.pop(queue))
        if None in down:
            break  # the rows left are read again by the next sweep, not now for nothing
    for queue, items in batches.items():  # dropped by ``repair`` once Redis is down
        repair(queue, items, read_at[queue])
    if horizon is None and ids is None and None not in down:
        for queue in each.until_down(each.run(engine.known_queues, list[str]())):
            if queue not in down:
                with each.attempt():
                    _clear_garbage(engine, queue, result.cleared)
    _report(result, moved)
    each.check(result)
    return result


def _pages(
    now: datetime, horizon: timedelta | None, ids: Collection[str] | None,
    clock: Callable[[], int],
) -> Iterator[tuple[list[tuple[Any, ...]], BaseDatabaseWrapper, int]]:  # fmt: skip
    """The rows to repair, ``CHUNK`` at a time, with the connection that read them and
    the time (``clock``) taken just before the query that read them: per
    status in (``run_at``, id) order, the order of the (status, run_at) index, each page a
    short query of its own past the last row read (keyset): after a full page, the rest of
    its last due time (``TIES`` rows a query), then the rows due after it. A cursor held
    for the whole sweep acted on rows as they were when it began (a job that died since
    was taken out of garbage again), and on SQLite held a read transaction that blocked
    WAL checkpoints.
    Ids, queues and due times are read as text, which cannot fail, and on SQLite as bytes:
    text that is not UTF-8 (raw SQL) failed the whole page. Positions are the values as
    the database holds them, given back as they were read: on SQLite, which keeps a value
    of any type in any column, a due time written by raw SQL as a number is read as it is
    (as text a REAL lost digits) and one written as a BLOB is given back as a BLOB (as
    text it was no longer one): such a position matched no row, and a full page of them
    was read again, for ever. A row whose status or due time changes during the sweep may
    be read twice (every move is idempotent) or not at all (the change pushed it to Redis
    itself, or the next sweep reads it)."""
    jobs = Job.objects.all() if ids is None else Job.objects.filter(pk__in=ids)
    conn = connections[jobs.db]
    sqlite = conn.vendor == "sqlite"
    as_text = BinaryField() if sqlite else TextField()
    # Compared by the database: a created_at Python cannot read never stops the sweep.
    fresh = Case(When(created_at__gt=now - FRESH, then=Value(True)), default=Value(False))
    # The priority too on SQLite, which keeps any text in its integer column (see _rank).
    priority = Cast("priority", as_text) if sqlite else "priority"
    run_at: Func = Cast("run_at", as_text)
    kind: Func | Value = Value("")  # the type SQLite holds the due time as
    if sqlite:
        run_at = Func("run_at", output_field=as_text, template=(
            "CASE WHEN typeof(%(expressions)s) IN ('integer', 'real') THEN %(expressions)s "
            "ELSE CAST(%(expressions)s AS BLOB) END"))  # fmt: skip
        kind = Func("run_at", function="typeof", output_field=TextField())
    columns = (Cast("pk", as_text), Cast("queue", as_text), run_at, priority, "status",
               fresh, kind)  # fmt: skip

    def stored(raw: Any, field: Field[Any, Any], kind: str = "") -> Cast | Value:
        if kind in ("integer", "real", "blob"):  # SQLite: as it holds it (int, float, bytes)
            return Value(raw)
        if sqlite:
            return Cast(Value(bytes(raw), BinaryField()), TextField())
        return Cast(Value(raw, TextField()), field)

    for status in (*WAITING, Status.RUNNING):
        rows = jobs.filter(status=status)
        if horizon is not None and status != Status.RUNNING:
            rows = rows.filter(run_at__lte=now + horizon)
        rows = rows.values_list(*columns).order_by("run_at", "pk")
        page = rows
        while True:
            at = clock()
            if not (found := cast("list[tuple[Any, ...]]", list(page[:CHUNK]))):
                break
            yield found, conn, at
            if len(found) < CHUNK:
                break
            pk = stored(found[-1][0], UUIDField())
            due = stored(found[-1][2], DateTimeField(), found[-1][6])
            # The rest of the last row's due time, in large pieces (``TIES``), then the
            # rows due after it: the index finds where each starts.
            while True:
                at = clock()
                ties = cast("list[tuple[Any, ...]]",
                            list(rows.filter(run_at=due, pk__gt=pk)[:TIES]))  # fmt: skip
                if not ties:
                    break
                for start in range(0, len(ties), CHUNK):
                    yield ties[start : start + CHUNK], conn, at
                if len(ties) < TIES:
                    break
                pk = stored(ties[-1][0], UUIDField())
            page = rows.filter(run_at__gt=due)


class _Skipped(ValueError):
    """A row no worker can claim; ``key`` names it in ``Reconciled.skipped``."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(why)
        self.key = key


def _texts(raw_id: Any, raw_queue: Any, raw_run_at: Any, kind: str,
           conn: BaseDatabaseWrapper, waits: bool) -> tuple[str, str, str]:  # fmt: skip
    """A row's id (as a job id), queue and due time as text; raise ``_Skipped`` for a row
    no worker can claim: its id is not a job id, or not in the form the database keeps
    one in (SQLite: 32 hex digits, the form a worker's claim looks for), its queue cannot
    name Redis keys, its queue is not UTF-8 text, or (SQLite), if it ``waits``, its due
    time is a BLOB, which sorts after every time, so that a claim never finds it due, or
    text that is not UTF-8. A running row's due time is not used: it is put back in flight
    (``adopt``) whatever it is, and settled by the worker path."""
    id_text, queue, run_at = (
        bytes(raw).decode("utf-8", "backslashreplace") if isinstance(raw, bytes | memoryview)
        else str(raw) for raw in (raw_id, raw_queue, raw_run_at)
    )  # fmt: skip
    try:
        job_id = str(uuid.UUID(id_text))
    except ValueError as exc:  # a hand-written id
        raise _Skipped(id_text, f"not a job id: {exc}") from None
    if not conn.features.has_native_uuid_field and id_text != uuid.UUID(id_text).hex:
        raise _Skipped(id_text, "the id is not stored as 32 hex digits, the form a worker "
                                "looks it up by (written by hand?)")  # fmt: skip
    if waits and kind == "blob":
        raise _Skipped(job_id, f"its due time is a BLOB, not a time: {bytes(raw_run_at)!r}")
    for what, raw in (("queue", raw_queue), ("due time", raw_run_at if waits else b"")):
        if isinstance(raw, bytes | memoryview) and not _utf8(bytes(raw)):
            raise _Skipped(job_id, f"its {what} is not UTF-8 text: {bytes(raw)!r}")
    try:
        validate_name(queue, "queue")
    except (TypeError, ValueError) as exc:  # an older version's, or hand-written
        raise _Skipped(job_id, str(exc)) from None
    return job_id, queue, run_at


def _rank(raw: Any) -> int:
    """A row's priority, read as bytes on SQLite: one that is no whole number in
    ``PRIORITY_RANGE`` (text written by raw SQL, not UTF-8 even) counts as 0, the default,
    the row repaired all the same: it failed the whole page on every sweep."""
    if isinstance(raw, bytes | memoryview):
        try:
            raw = int(bytes(raw).decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            return 0
    return raw if type(raw) is int and raw in PRIORITY_RANGE else 0


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


def _clear_garbage(engine: Engine, queue: str, cleared: Counter[str]) -> None:
    """Take the ids of jobs that are not dead (finished otherwise, or deleted) out of
    ``queue``'s garbage, counting them in ``cleared`` as they go (a failure partway keeps
    the count of what was done). A waiting or running job's id is left to the repair above
    (``requeue``, ``adopt``), an id that is not a job id to whoever wrote it."""
    cleared[queue] += 0  # a queue read, even with none to take out, is reported
    for chunk in engine.garbage_ids(queue, CHUNK):
        ids = [id_ for id_ in chunk if _is_job_id(id_)]
        statuses = _statuses(ids)
        stale = [id_ for id_ in ids if statuses.get(id_) not in (Status.DEAD, *ACTIVE)]
        if stale:
            try:
                cleared[queue] += engine.purge(queue, stale)
            except PartlyUnavailable as exc:  # those taken out on the shards that answered
                cleared[queue] += exc.done
                raise


def _is_job_id(text: str) -> bool:
    try:
        return str(uuid.UUID(text)) == text
    except ValueError:
        return False


def _report(result: Reconciled, moved: Counter[str]) -> None:
    if sum(result.cleared.values()):
        logger.warning("reconcile took %s id(s) out of Redis garbage whose job is not dead: "
                       "%s", sum(result.cleared.values()), dict(+result.cleared))  # fmt: skip
    if sum(moved.values()):  # a Counter holding zeros is truthy
        logger.info("reconcile moved %s waiting job(s) to their shard under QUEUE_SHARDS: %s",
                    sum(moved.values()), dict(moved))  # fmt: skip
    if sum(result.values()):
        logger.warning("reconcile re-added %s job(s) Redis did not hold: %s",
                       sum(result.values()), dict(result))  # fmt: skip
    for rows, what in (
        (result.unusable, "whose due time cannot be used; handed them to a worker due now, "
                          "which runs each one or settles it dead"),
        (result.skipped, "that no worker can claim; fix or delete them"),
    ):  # fmt: skip
        if rows:
            shown = "; ".join(f"{pk}: {why}" for pk, why in list(rows.items())[:10])
            logger.warning("reconcile found %s job(s) %s: %s%s", len(rows), what, shown,
                           " ..." if len(rows) > 10 else "")  # fmt: skip


def _repair(
    engine: Engine,
    queue: str,
    items: dict[str, float],
    priorities: dict[str, int],
    young: set[str],
    running: set[str],
    moved: Counter[str],
    since: int,
) -> int:
    """Make Redis hold ``items`` (with their ``priorities``; the ``running`` ones in
    flight), read at ``since`` or later; return how many it did not hold, leaving out ids
    of ``young`` rows (see ``FRESH``). An id found waiting in a shard of an older count is
    moved to its shard (by ``Engine.add``), not counted."""
    # The shards whose master is down wait; the others are repaired. On one Redis a call
    # that got no answer ends the chunk: each next call would wait out the same timeout.
    each = PerShard(one_server=not engine.is_cluster)
    ranks = {id_: priorities.pop(id_) for id_ in items if id_ in priorities}
    in_flight = [id_ for id_ in items if id_ in running]
    running.difference_update(in_flight)
    repaired = _adopt(engine, queue, in_flight, each) if in_flight else 0
    flying = set(in_flight)
    waiting = {id_: due for id_, due in items.items() if id_ not in flying}
    if waiting:
        repaired += _add(engine, queue, waiting, ranks, young, moved, each, since)
    young.difference_update(items)
    each.check(repaired)
    return repaired


def _add(
    engine: Engine,
    queue: str,
    items: dict[str, float],
    ranks: dict[str, int],
    young: set[str],
    moved: Counter[str],
    each: PerShard,
    since: int,
) -> int:
    """Add the waiting ``items``, read at ``since`` or later; return how many Redis did not
    hold (see ``_repair``)."""
    # A waiting job found in garbage was requeued while Redis was unreachable: its id was
    # buried before its row was read. One buried since (its job ran and died after the
    # read) is left there: its row is dead.
    requeue = partial(engine.requeue, queue, list(items), buried_before=since)
    revived = each.run(requeue, list[str]())
    ranks = {id_: rank for id_, rank in ranks.items() if id_ in items}
    # An id waiting in a shard of an older count is moved by the add (``Added.moved``).
    found = each.run(partial(engine.add, queue, items, ranks, only_earlier=True), Added())
    moved[queue] += len(found.moved)
    added = _still_active(queue, engine, found, each)
    arriving = sum(1 for id_ in added if id_ in young)
    return len(revived) + max(0, len(added) - arriving)


def _clock(engine: Engine) -> Callable[[], int]:
    """Now in whole ms, by the clock garbage is scored by (the time of death, ``bury``),
    for the repair's requeue (see ``_add``). On one Redis: its clock, asked once (the
    sweep's first call), then moved on by this process's monotonic clock; taken after the
    answer, the time is a little early, which only leaves an id buried just before a read
    for the next sweep. On a Cluster, each shard buries by its own clock: Django's is
    used. A clock behind Redis's leaves a lost requeue's id in garbage until a later sweep;
    one ahead may take out the id of a job that died just after its row was read, which a
    worker's claim then buries again (its row is dead)."""
    if engine.is_cluster:
        return lambda: int(timing.to_ms(timezone.now()))
    start = engine.server_time_ms() - time.monotonic() * 1000
    return lambda: int(start + time.monotonic() * 1000)


def _adopt(engine: Engine, queue: str, ids: list[str], each: PerShard) -> int:
    """Put the running ``ids`` that Redis holds nowhere, or only in garbage, back in
    flight; return how many. A job that finished since its row was read leaves flight
    again at once: to garbage if it died (its worker may have buried the id just before
    the adopt took it out), else nowhere. One waiting again (it died, and a requeue's row
    committed before its Redis step, which then found the id out of garbage) goes back to
    pending, due now: left in flight, no worker would run it before its lease ended (the
    worker that claims it defers it to its row's due time, if later)."""
    lease_ms = delayjobs_settings.LEASE_SECONDS * 1000
    adopted = each.run(partial(engine.adopt, queue, ids, lease_ms), list[str]())
    if not adopted:
        return 0
    statuses = _statuses(adopted)
    waiting = [id_ for id_ in adopted if statuses.get(id_) in WAITING]
    if waiting:
        now_ms = timing.to_ms(timezone.now())
        each.run(partial(engine.nack, queue, dict.fromkeys(waiting, now_ms)), 0)
    finished = [id_ for id_ in adopted if statuses.get(id_) not in ACTIVE]
    dead = [id_ for id_ in finished if statuses.get(id_) == Status.DEAD]
    if dead:
        each.run(partial(engine.bury, queue, dead), 0)
        _follow(engine, queue, dead, each)
    if len(dead) < len(finished):
        each.run(partial(engine.ack, queue, [i for i in finished if i not in dead]), 0)
    return len(adopted) - len(finished)


def _statuses(ids: list[str]) -> dict[str, str]:
    return {str(pk): status for pk, status in Job.objects.filter(pk__in=ids)
            .values_list("pk", "status")}  # fmt: skip


def _active(ids: list[str]) -> list[str]:
    return [id_ for id_, status in _statuses(ids).items() if status in ACTIVE]


def _still_active(queue: str, engine: Engine, added: list[str], each: PerShard) -> list[str]:
    """The re-added ids whose job is still active. The rows were read before the add, and
    a worker may have finished a job (and acked its id) in between: such an id is taken
    out again, so that it is neither counted as repaired nor left to be delivered for
    nothing. A worker may claim it before this read: that delivery is dropped by the
    claim's conditional UPDATE (the action does not run again), and counted in the
    worker's status line all the same."""
    if not added:
        return added
    active = set(_active(added))
    finished = [id_ for id_ in added if id_ not in active]
    if finished:
        each.run(partial(engine.remove, queue, finished), 0)
        _follow(engine, queue, finished, each)
    return [id_ for id_ in added if id_ in active]


def _follow(engine: Engine, queue: str, ids: list[str], each: PerShard) -> None:
    """Put back the ``ids`` just buried or taken out whose job waits again: a requeue that
    committed after their rows were read found the id where this sweep had put it (in
    flight, pending), left it there, and the bury or removal then stranded it until the
    next sweep. Read again after the move, as after every push (``follow_row``)."""
    statuses = _statuses(ids)
    again = [id_ for id_ in ids if statuses.get(id_) in WAITING]
    if again and not each.down:
        each.run(partial(engine.requeue, queue, again), list[str]())  # out of garbage
        for id_ in again:  # or added, if the removal took it out of pending
            each.run(partial(follow_row, engine, queue, id_, None, held=False), None)


def horizon() -> timedelta:
    return timedelta(seconds=delayjobs_settings.RECONCILE_HORIZON_SECONDS)
