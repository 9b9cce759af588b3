"""Health checks of a deployment, shared by ``manage.py delayjobs_health`` and the
``health/`` view.

Each check is cheap: two Redis round trips for Redis (``INFO`` and a ``SETRANGE`` of
nothing on a key that does not exist, per master), two ``SELECT`` for the database (one a
primary-key lookup; on SQLite also an ``UPDATE`` that matches no row), and per queue one
stats script call (counts of sorted sets, no scan) plus at most one query by primary
keys (the due time of the oldest ready job, as for the metrics, waited for at most 5 s:
``bounded.read``). The whole check takes at most ``Limits.timeout`` seconds (see
``run_from_settings``): past it, the checks not made fail, naming what it waits on.

- ``redis``: the client has a socket timeout (else it fails without asking Redis, and
  the queue checks with it: a Redis that stops answering would hold the check for good),
  Redis answers (its ``INFO``; every master's on a Cluster) and takes writes:
  not a replica, not at ``maxmemory`` with ``noeviction`` (nor with a ``volatile-*``
  policy and nothing to evict: ``OOM``), not unable to persist (``MISCONF``) and not
  short of ``min-replicas-to-write`` replicas (``NOREPLICAS``): it answers those to every
  write, so to the check's ``SETRANGE`` of nothing (which changes nothing).
  On a Cluster, a master that does not answer while others do fails it (named), and the
  checks of each queue with a key on that master fail without asking it again; the
  queues on the other masters are checked as usual (one Redis that does not answer fails
  every queue check at once).
- ``database``: the jobs' database answers within ``bounded.DATABASE_TIMEOUT_SECONDS``
  and takes writes: a PostgreSQL standby, or a database with
  ``default_transaction_read_only``, would refuse every claim, as would a PostgreSQL role
  that may not update the job table (asked in the same query), or a SQLite file (or
  filesystem) that is read-only; and the job table has every column (not so until the
  app's migrations are applied).
- ``workers:<queue>``: at least ``min_workers`` processes heartbeat for the queue (any
  ``run_delayworker`` that serves it, promoter-only ones too; one counts as live for three
  ``HEARTBEAT_SECONDS`` after its last beat). It fails saying it cannot tell when they
  cannot be read (the master of a sharded queue's own name down), never counting 0.
- ``overdue:<queue>``: the oldest job that is due and has not started has waited at most
  ``max_overdue`` seconds (a due job nobody promoted, a ready job nobody claimed, or a
  job whose lease ran out that nobody recovered: since the lease's end).
  A ready job's due time is its row's: when the ``database`` check failed, a queue with a
  ready job fails this one without asking the database again.
- ``garbage:<queue>`` (only with ``max_garbage``): the queue holds at most that many dead
  jobs in its garbage (dead, not yet requeued or purged).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from django.contrib.auth.decorators import login_not_required
from django.db import Error as DatabaseError
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.http import HttpRequest, HttpResponse, JsonResponse, QueryDict
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from . import bounded, sql
from .engine import DelayJobsError, EngineUnavailable, validate_name
from .engine.errors import PartlyUnavailable, unreachable
from .engine.waiting import socket_timeout
from .models import Job
from .numbers import decimal_number, whole_number

if TYPE_CHECKING:
    from .engine import Engine

logger = logging.getLogger("django_delayjobs.health")

MAX_QUEUES = 100
MAX_OVERDUE = 366 * 86_400.0
MAX_WORKERS = 100_000
MAX_GARBAGE = 10**12
DEFAULT_MAX_OVERDUE = 60.0
#: How long a whole check may take by default: under the 5 s that load balancers' probes
#: wait by default, so that a probe hears why the check fails rather than time out.
DEFAULT_TIMEOUT = 4.0
#: The bounds of a check's timeout. Anyone may ask ``health/``: one who asks for a tiny one
#: would answer fail at once, and one who asks for a long one would hold the check, which
#: the probes of other limits wait for; the command, run by operators only, may take longer.
MIN_TIMEOUT = 0.5
MAX_VIEW_TIMEOUT = 30.0
MAX_TIMEOUT = 600.0
#: Why ``redis`` fails, without asking, for a client whose connections have no socket
#: timeout: a Redis that stops answering (frozen, or cut off with no reset) would hold the
#: probe, or the web worker serving ``health/``, for good.
NO_SOCKET_TIMEOUT = (
    "not asked: the Redis client has no socket timeout, so a Redis that stops answering "
    "would hold this check for good (run_delayworker refuses it too). Give it one, 1 to "
    "5 s (the SOCKET_TIMEOUT of the CACHE_ALIAS cache's OPTIONS, or socket_timeout in its "
    "CONNECTION_POOL_KWARGS)"
)


@dataclass(frozen=True)
class Check:
    """One check's name (``redis``, ``workers:orders``...), result and explanation, on
    one line (an error's text may hold several: psycopg's "Is the server running...?")."""

    name: str
    ok: bool
    detail: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "detail", " ".join(self.detail.split()))


@dataclass(frozen=True)
class Limits:
    """What the queue checks demand (validated by the ``parse_*`` functions)."""

    queues: tuple[str, ...]
    max_overdue: float = DEFAULT_MAX_OVERDUE
    min_workers: int = 1
    max_garbage: int | None = None
    timeout: float = DEFAULT_TIMEOUT


def parse_queues(text: str) -> tuple[str, ...]:
    """A comma-separated list of queue names; ValueError if any is not one."""
    names = tuple(dict.fromkeys(q.strip() for q in text.split(",") if q.strip()))
    if not names:
        raise ValueError("no queue given")
    if len(names) > MAX_QUEUES:
        raise ValueError(f"at most {MAX_QUEUES} queues")
    for name in names:
        validate_name(name, "queue name")
    return names


def parse_seconds(text: str, low: float = 0.0, high: float = MAX_OVERDUE) -> float:
    """A number of seconds from ``low`` to ``high``; ValueError if it is not one."""
    try:
        value = decimal_number(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"must be from {low:g} to {high:.0f} seconds, not {text!r}")
    return value


def parse_count(text: str, high: int) -> int:
    value = whole_number(text)
    if not 0 <= value <= high:
        raise ValueError(f"must be from 0 to {high}, not {text!r}")
    return value


def run(engine: Engine, limits: Limits) -> list[Check]:
    """Run every check; never raises for an unreachable Redis or database."""
    if socket_timeout(engine.client) is None:  # not asked: it could hold the check for good
        redis = Check("redis", False, NO_SOCKET_TIMEOUT)
        return without_redis(redis, limits, "not checked: the Redis client has no socket timeout")
    down: dict[str, str] = {}  # the masters of a Cluster that do not answer, with why
    checks = _progress().made  # in place, so that a caller that gives up sees them
    redis, reachable = check_redis(engine, down)
    checks.append(redis)
    if not reachable:
        return without_redis(redis, limits)
    database = check_database()
    checks.append(database)
    for n, queue in enumerate(limits.queues):
        away = _on_masters_down(engine, queue, down)
        if away:  # asking would wait for it again, once per queue on it
            checks += _failed([queue], limits, away)
            continue
        try:
            checks += _queue_checks(engine, queue, limits, rows=database.ok, down=down)
        except EngineUnavailable as exc:  # stopped answering: each call would wait as long
            if engine.is_cluster:  # the master that did not answer only (the reads put it
                checks += _failed([queue], limits, str(exc))  # in ``down``): not the others
                continue
            left = _failed(limits.queues[n + 1 :], limits, f"not checked: {exc}")
            return checks + _failed([queue], limits, str(exc)) + left
    return checks


def _masters(engine: Engine, queue: str) -> set[str]:
    """The addresses of the Cluster masters that hold the keys of ``queue``'s shards and
    of its live workers. No Redis call: the client's slot table (and the directory of
    queues, as last read, for the shards of an older count)."""
    names = [*engine.shards(queue), queue]
    return {engine.node_of(name) for name in names}


def _on_masters_down(engine: Engine, queue: str, down: dict[str, str]) -> str | None:
    """Why the checks of ``queue`` fail without asking Redis (a key of it is on a master
    in ``down``), or None."""
    if not down or not engine.is_cluster:
        return None
    try:
        away = sorted(_masters(engine, queue) & set(down))
    except EngineUnavailable:  # its slot has no master in the client's table
        return None
    if not away:
        return None
    address, why = away[0], down[away[0]]
    return f"unavailable: a key of it is on master {address}, which does not answer ({why})"


def without_redis(redis: Check, limits: Limits, why: str = "Redis is unavailable") -> list[Check]:
    """Every check when Redis does not answer (``redis`` says why), or is not asked: the
    queue checks fail."""
    return [redis, check_database(), *_failed(limits.queues, limits, why)]


def _failed(queues: Sequence[str], limits: Limits, why: str) -> list[Check]:
    return [Check(f"{kind}:{q}", False, why) for q in queues for kind in _kinds(limits)]


def run_from_settings(limits: Limits) -> list[Check]:
    """``run`` on the engine of the settings, within ``limits.timeout``; raise
    ``DelayJobsError`` for settings that give none. A Redis Cluster none of whose seeds
    answers gives no engine either (its client reads the slot table when it is made): that
    is Redis unavailable.

    The checks run in a thread of their own (a call that waits on a socket cannot be
    stopped), one run at a time per process. A caller whose limits but the timeout are
    those of the run under way shares it if it started less than that timeout ago (so a
    run lasts at most about twice the longest timeout, and its answer is never older than
    the caller's timeout); any other waits for it to end, then starts its own, within its
    own timeout. Past it the checks not made fail, naming what the run waits on; once
    every caller sharing a run has answered without it, it stops before its next call (a
    master of a Cluster, a shard of a queue: see ``_step``)."""
    deadline = time.monotonic() + limits.timeout
    shared = replace(limits, timeout=0.0)  # the timeout is each caller's own
    global _latest
    while True:
        with _lock:
            run = _latest
            now = time.monotonic()
            if run.done.is_set() and now < deadline:
                run = _latest = _Run.start(shared)
            # Joined only while younger than this caller's timeout: callers that keep
            # coming (a prober every second) cannot keep a run going, or its answers old.
            joins = run.limits == shared and now - run.started < limits.timeout
            if joins and not run.progress.given_up.is_set():
                run.callers += 1
                break
        ended = run.done.wait(max(0.0, deadline - time.monotonic()))  # then start one
        if not ended or time.monotonic() >= deadline:
            why = f"in time: an earlier health check still waits on {run.progress.waiting_on}"
            return _answer(limits, [], why)
    try:
        if run.done.wait(max(0.0, deadline - time.monotonic())):
            if run.error is not None:
                raise _own(run.error) from run.error
            return list(run.checks)
    finally:
        with _lock:
            run.callers -= 1
            if not run.callers and not run.done.is_set():
                run.progress.given_up.set()
    waited = f"the health check's {limits.timeout:g} s"
    return _answer(
        limits, run.progress.made, f"within {waited}, waiting on {run.progress.waiting_on}"
    )


def _own(error: Exception) -> Exception:
    """A copy of a check run's ``error`` for one of its callers to raise, from the original:
    raising one exception object adds the raiser's frames to its traceback, and the callers
    sharing a run raise at once, each in its own thread. The same type, message and
    attributes, so what catches it (the view, ``delayjobs_health``) reads it as before."""
    try:
        own = copy.copy(error)
    except Exception:  # an __init__ that the exception's args do not fit
        own = None
    if type(own) is not type(error) or own.args != error.args:  # or that rewrites them
        try:
            own = type(error).__new__(type(error), *error.args)
            own.__dict__.update(vars(error))
        except Exception:  # no copy at all: the shared one, as before
            return error
    return own


def _answer(limits: Limits, made: list[Check], why: str) -> list[Check]:
    """The checks of ``limits``: those in ``made`` as made, the others failing, ``not
    checked`` and ``why``."""
    found = {c.name: c for c in list(made)}
    return [found.get(name) or Check(name, False, f"not checked {why}") for name in _names(limits)]


class GivenUp(Exception):
    """Raised in a check run whose callers have all answered without it: it stops there."""


@dataclass
class Progress:
    """What a check run waits on, the checks it has made, and whether its callers gave up
    on it (then it stops before its next call)."""

    waiting_on: str = "nothing"
    made: list[Check] = field(default_factory=list)
    given_up: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Run:
    """A check run in a thread of its own, shared by its ``callers`` (its ``limits`` have
    no timeout): its checks, or the error it raised, once ``done``."""

    limits: Limits
    progress: Progress = field(default_factory=Progress)
    done: threading.Event = field(default_factory=threading.Event)
    checks: list[Check] = field(default_factory=list)
    error: Exception | None = None
    callers: int = 0
    started: float = field(default_factory=time.monotonic)

    @classmethod
    def start(cls, limits: Limits) -> _Run:
        run = cls(limits)

        def checks() -> None:
            _current.progress = run.progress
            try:
                run.checks = _unbounded_from_settings(limits)
            except Exception as exc:  # given to its callers (GivenUp: none is left)
                run.error = exc
            except BaseException as exc:  # never an empty list, which reads as healthy
                run.error = RuntimeError(f"the health check ended with {exc!r}")
            finally:
                with contextlib.suppress(DatabaseError):
                    connections.close_all()  # this thread's connections only
                run.done.set()

        threading.Thread(target=checks, name="delayjobs-health", daemon=True).start()
        return run


_lock = threading.Lock()  # over ``_latest`` and its ``callers``
_latest = _Run(Limits(queues=()))  # the latest run started
_latest.done.set()
_current = threading.local()  # the ``Progress`` of the run in this thread, if any


def _progress() -> Progress:
    return getattr(_current, "progress", None) or Progress()


def _step(what: str) -> None:
    """Note that the check run of this thread now waits on ``what``; ``GivenUp`` if its
    caller has answered without it."""
    progress = getattr(_current, "progress", None)
    if progress is not None:
        if progress.given_up.is_set():
            raise GivenUp
        progress.waiting_on = what


def _names(limits: Limits) -> list[str]:
    """The names of the checks of a run, in order."""
    return ["redis", "database", *(f"{kind}:{q}" for q in limits.queues for kind in _kinds(limits))]


def _unbounded_from_settings(limits: Limits) -> list[Check]:
    from .connection import get_engine

    _step("Redis (a Cluster's slot table)")
    try:
        engine = get_engine()
    except EngineUnavailable as exc:
        return without_redis(Check("redis", False, f"unavailable: {exc}"), limits)
    return run(engine, limits)


def _kinds(limits: Limits) -> list[str]:
    return ["workers", "overdue"] + (["garbage"] if limits.max_garbage is not None else [])


def check_redis(engine: Engine, down: dict[str, str] | None = None) -> tuple[Check, bool]:
    """Whether Redis answers and takes writes (every master of a Cluster), and whether it
    answers at all (the queue checks only read). With ``down``, each master of a Cluster
    that does not answer goes into it (its address, with why) while another one does: the
    check fails, naming it, and the queues on the other masters can still be checked."""
    try:
        masters = engine.masters(down, before=_asking("its INFO"))
    except EngineUnavailable as exc:  # a refusal (MISCONF to redis-py's PING) is an answer
        return Check("redis", False, f"unavailable: {exc}"), not unreachable(exc)
    for address, info in masters.items():
        where = f" (master {address})" if address else ""
        if info.get("role", "master") != "master":
            return Check("redis", False, f"refuses writes{where}: it is a replica"), True
        used, limit = info.get("used_memory", 0), info.get("maxmemory", 0)
        if limit and used >= limit and info.get("maxmemory_policy") == "noeviction":
            return Check("redis", False, (
                f"full{where}: used_memory {used} of maxmemory {limit} with noeviction, so "
                "it refuses new jobs (they wait in the database)"
            )), True  # fmt: skip
    try:
        refused = engine.refused_write(down, before=_asking("a write that changes nothing"))
    except EngineUnavailable as exc:  # it died after its INFO: it does not answer at all
        return Check("redis", False, f"unavailable: {exc}"), False
    if down:  # a Cluster with masters that do not answer; the others do
        address, why = sorted(down.items())[0]
        others = f" (and {len(down) - 1} more)" if len(down) > 1 else ""
        return Check("redis", False, f"unavailable (master {address}{others}): {why}; the "
                     "queues on the other masters are checked"), True  # fmt: skip
    if refused is not None:  # MISCONF, NOREPLICAS: it takes no write
        address, refusal = refused
        where = f" (master {address})" if address else ""
        return Check("redis", False, f"refuses writes{where}: {refusal}"), True
    return Check("redis", True, "answers"), True


def _asking(what: str) -> Callable[[str], None]:
    """A step (``_step``) for each master that is asked ``what`` ("": the one Redis)."""
    return lambda address: _step(f"Redis ({f'master {address}: ' if address else ''}{what})")


def check_database() -> Check:
    """``database``, within ``bounded.DATABASE_TIMEOUT_SECONDS``: the check is a
    ``bounded.read``, since a server that accepts connections and never answers (a host
    that hangs) would hold the probe, or the web worker serving ``health/``, for ever. One
    such read runs at a time: a check made while one is under way (another probe's, a
    scrape's) waits for it within its own bound, and fails at once past that one's."""

    def check() -> Check:  # in the read's thread: a connection of its own, closed after
        return _check_database(connections[sql.db()])

    _step("the database")
    try:
        return bounded.read(check, name="delayjobs-health-database")
    except bounded.DatabaseTimeout as exc:
        return Check("database", False, str(exc))
    except DatabaseError as exc:  # outside the queries the check reports itself
        return Check("database", False, f"unavailable: {str(exc).strip() or type(exc).__name__}")


def _check_database(conn: BaseDatabaseWrapper) -> Check:
    try:
        with conn.cursor() as cursor:
            if conn.vendor == "postgresql":  # a standby, or default_transaction_read_only;
                # a role that may update no column of the job table (a grant of the
                # columns a claim updates is enough; NULL: no table, said below)
                cursor.execute(
                    "SELECT current_setting('transaction_read_only'), "
                    "coalesce(has_any_column_privilege(to_regclass(%s), 'UPDATE'), true), "
                    "current_user",
                    [conn.ops.quote_name(Job._meta.db_table)],
                )
            else:
                cursor.execute("SELECT 'off', true, ''")
            setting, may_update, role = cursor.fetchone()
            read_only = setting == "on"
    except DatabaseError as exc:
        return Check("database", False, f"unavailable: {str(exc).strip() or type(exc).__name__}")
    if not may_update:
        return Check("database", False, (
            f"refuses writes: this role ({role}) may not update the job table, so no "
            "worker can claim a job"
        ))  # fmt: skip
    if read_only:
        return Check(
            "database",
            False,
            "refuses writes (transaction_read_only is on: a standby "
            "server, or default_transaction_read_only), so no worker can claim a job",
        )
    try:  # every column, by primary key: a table or column missing fails here
        list(Job.objects.using(conn.alias).filter(pk=uuid.UUID(int=0)))
    except DatabaseError as exc:
        return Check("database", False, (
            "cannot read the job table (are the migrations applied? manage.py migrate): "
            f"{str(exc).strip() or type(exc).__name__}"
        ))  # fmt: skip
    refusal = sqlite_refusal(conn) if conn.vendor == "sqlite" else None
    if refusal is not None:
        return Check("database", False, f"refuses writes ({refusal}), so no worker can claim a job")
    return Check("database", True, "answers")


def sqlite_refusal(conn: BaseDatabaseWrapper) -> str | None:
    """Why SQLite refuses writes (a file or filesystem that is read-only), or None. It
    opens such a file read-only without a word and answers every read: only a write says
    so. This one matches no row, and waits for no lock: a worker may hold the write lock
    for as long as an atomic action runs, and a database that is locked takes writes."""
    meta: Any = Job._meta
    table, column = (conn.ops.quote_name(name) for name in (meta.db_table, meta.pk.column))
    with conn.cursor() as cursor:  # this check's own connection: its busy timeout is ours
        cursor.execute("PRAGMA busy_timeout = 0")
        try:
            cursor.execute(f"UPDATE {table} SET {column} = {column} WHERE 0 = 1")
        except DatabaseError as exc:
            if getattr(exc.__cause__, "sqlite_errorname", "") == "SQLITE_BUSY":
                return None
            return str(exc).strip() or type(exc).__name__
    return None


def check_queue(engine: Engine, queue: str, limits: Limits, rows: bool = True) -> list[Check]:
    """The queue's checks; without ``rows`` (the ``database`` check failed) the due time of
    a ready job is not read: a database that did not answer that check within its bound
    would hold this one, outside any bound, for as long as it does not answer."""
    try:
        return _queue_checks(engine, queue, limits, rows)
    except EngineUnavailable as exc:
        return _failed([queue], limits, str(exc))


def _queue_checks(
    engine: Engine, queue: str, limits: Limits, rows: bool, down: dict[str, str] | None = None
) -> list[Check]:
    """``check_queue``, but a Redis that does not answer (``unreachable``) raises its
    ``EngineUnavailable``: the checks of the next queues need not wait for it too. With
    ``down`` (on a Cluster), the master that did not answer goes into it, and no other."""
    from .metrics.snapshot import oldest_overdue

    _step(f"Redis (the state of queue {queue})")
    try:
        stats = engine.stats(queue, down)
    except DelayJobsError as exc:
        if _stopped_answering(exc):
            raise
        failed = _failed([queue], limits, str(exc))
        if isinstance(exc, PartlyUnavailable) and exc.done.live_workers is None:
            failed[0] = _workers(queue, None, limits, exc)
        return failed
    checks = [_workers(queue, stats.live_workers, limits)]
    if not rows and stats.ready:
        checks.append(Check(f"overdue:{queue}", False, "cannot tell: a ready job's due time "
                            "is its row's, and the database check failed"))  # fmt: skip
        return checks + _garbage(queue, stats.garbage, limits)

    def before(shard: str) -> None:
        _step(f"Redis and the database (the due time of queue {shard}'s oldest ready job)")

    try:
        overdue = oldest_overdue(engine, stats, down, before)
    except (DelayJobsError, DatabaseError) as exc:
        if _stopped_answering(exc):
            raise
        checks.append(Check(f"overdue:{queue}", False, f"cannot tell: {exc}"))
    else:
        checks.append(Check(f"overdue:{queue}", overdue <= limits.max_overdue,
                            f"oldest due job waiting {overdue:.1f} s, at most "
                            f"{limits.max_overdue:g} s allowed"))  # fmt: skip
    return checks + _garbage(queue, stats.garbage, limits)


def _workers(queue: str, live: int | None, limits: Limits, why: object = "") -> Check:
    name = f"workers:{queue}"
    if live is None:  # a queue split into shards whose own name's master does not answer
        return Check(name, False, f"cannot tell: its live workers cannot be read ({why})")
    wanted = limits.min_workers
    return Check(name, live >= wanted, f"{live} live worker process(es), at least {wanted} wanted")


def _stopped_answering(exc: Exception) -> bool:
    return isinstance(exc, EngineUnavailable) and unreachable(exc)


def _garbage(queue: str, garbage: int, limits: Limits) -> list[Check]:
    if limits.max_garbage is None:
        return []
    return [Check(f"garbage:{queue}", garbage <= limits.max_garbage,
                  f"{garbage} dead job(s) in the garbage, at most {limits.max_garbage} "
                  "allowed")]  # fmt: skip


def healthy(checks: Sequence[Check]) -> bool:
    return all(c.ok for c in checks)


# -- the health/ view ------------------------------------------------------------------------


def limits_from_query(query: QueryDict) -> Limits:
    """The view's limits from its query string (``queues``, ``max_overdue``,
    ``min_workers``, ``max_garbage``, ``timeout``); ValueError for a bad one, or one given
    twice (it would be read by its last value: a monitor asking ``?queues=a&queues=b``
    must not be told that b is ok while only a was checked)."""
    from .conf import delayjobs_settings

    unknown = set(query) - {"queues", "max_overdue", "min_workers", "max_garbage", "timeout"}
    if unknown:
        raise ValueError("unknown parameter")
    for name, values in query.lists():
        if len(values) > 1:
            raise ValueError(f"{name} given {len(values)} times: give it once")
    queues, garbage = query.get("queues"), query.get("max_garbage")
    return Limits(
        queues=(delayjobs_settings.DEFAULT_QUEUE,) if queues is None else parse_queues(queues),
        max_overdue=parse_seconds(query.get("max_overdue", str(DEFAULT_MAX_OVERDUE))),
        min_workers=parse_count(query.get("min_workers", "1"), MAX_WORKERS),
        max_garbage=None if garbage is None else parse_count(garbage, MAX_GARBAGE),
        timeout=parse_seconds(
            query.get("timeout", str(DEFAULT_TIMEOUT)), MIN_TIMEOUT, MAX_VIEW_TIMEOUT
        ),
    )


@login_not_required  # a probe has no session (LoginRequiredMiddleware would redirect it)
@never_cache
@require_safe
def health_view(request: HttpRequest) -> HttpResponse:
    """GET/HEAD: 200 when every check passes, else 503; the body names the checks and
    says ok or fail, nothing more (no details, no job data): it needs no login."""
    try:
        try:
            limits = limits_from_query(request.GET)  # reads DEFAULT_QUEUE
        except ValueError as exc:
            return JsonResponse({"error": f"bad query: {exc}"}, status=400)
        checks = run_from_settings(limits)
    except DelayJobsError:  # invalid settings (a web process runs no system checks)
        logger.warning("health: DELAYJOBS settings are invalid")
        return JsonResponse({"status": "fail", "checks": {"settings": "fail"}}, status=503)
    failed = [f"{c.name} ({c.detail})" for c in checks if not c.ok]
    if failed:  # one line per request, whatever it asked about
        logger.warning("health: %s failed: %s", len(failed), "; ".join(failed[:5]))
    ok = healthy(checks)
    body = {"status": "ok" if ok else "fail",
            "checks": {c.name: "ok" if c.ok else "fail" for c in checks}}  # fmt: skip
    return JsonResponse(body, status=200 if ok else 503)
