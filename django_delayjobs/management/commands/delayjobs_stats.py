"""``manage.py delayjobs_stats``: the state of every queue as a plain table.

A queue of several shards gets a row of totals, then one row per shard (indented); on a
Redis Cluster the last column names the master that holds each shard. A name Redis never
held (a typo, a shard of a count the queue never had) is said to be unknown, not shown
as a row of zeros: "nothing waiting" to an operator who mistyped. Live workers that cannot
be read (on a Cluster, the master of a sharded queue's own name is down) show as ``?``.
A Redis client with no socket timeout is refused without asking Redis (as
``run_delayworker`` refuses it): a Redis that stops answering would hold the command for
good.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError

from ...conf import delayjobs_settings
from ...connection import get_engine
from ...engine import (
    DelayJobsError,
    Engine,
    EngineUnavailable,
    PartlyUnavailable,
    QueueStats,
    WrongType,
    sharding,
)
from ...preflight import check_socket_timeout
from ...queues import missing_shards, ms_datetime
from ..output import SafeOutputCommand

COLUMNS = (
    "queue", "pending", "overdue", "ready", "in_flight", "garbage", "next_due", "workers",
    "master",
)  # fmt: skip
#: The workers of a queue whose live workers cannot be read (its own name's master down).
UNKNOWN = "?"


def _when(ms: int | None, now_ms: int) -> str:
    if ms is None:
        return "-"
    at = ms_datetime(ms)
    return f"{at:%Y-%m-%d %H:%M:%S} ({(ms - now_ms) / 1000:+.1f}s)"


def row(
    s: QueueStats, name: str | None = None, workers: str = "", master: str = ""
) -> tuple[str, ...]:
    live = UNKNOWN if s.live_workers is None else str(s.live_workers)
    return (name or s.queue, str(s.pending), str(s.overdue), str(s.ready), str(s.in_flight),
            str(s.garbage), _when(s.next_due_ms, s.now_ms), workers or live,
            master or "-")  # fmt: skip


def known(engine: Engine, name: str, listed: set[str]) -> bool:
    """Whether ``name`` is a queue (or one of its shards) that Redis holds or this
    deployment uses: listed in the directory, ``DEFAULT_QUEUE``, a queue of
    ``QUEUE_SHARDS`` or ``API_CALLBACK_QUEUES``; a shard is one the queue's count or the
    directory gives it."""
    shard = sharding.parse(name)
    used = {delayjobs_settings.DEFAULT_QUEUE, *delayjobs_settings.QUEUE_SHARDS,
            *(delayjobs_settings.API_CALLBACK_QUEUES or ())}  # fmt: skip
    if shard.queue not in listed | used:
        return False
    return not sharding.explicit(name) or shard in map(sharding.parse, engine.shards(shard.queue))


def empty(r: tuple[str, ...]) -> bool:
    """No job in any state and no live worker (a queue that holds ids is shown, even one
    the directory lost)."""
    counts = dict(zip(COLUMNS, r, strict=True))
    return all(counts[c] == "0" for c in ("pending", "ready", "in_flight", "garbage", "workers"))


def rows(
    engine: Engine,
    queue: str,
    stats: QueueStats | None = None,
    down: dict[str, str] | None = None,
) -> list[tuple[str, ...]]:
    """The queue's row, then (for a queue of several shards) one row per shard. With
    ``down`` (see ``Engine.stats``), a Cluster master that did not answer is not asked."""
    stats = stats or engine.stats(queue, down)
    if not stats.shards:
        return [row(stats, master=engine.node_of(queue))]
    return [row(stats)] + [
        row(shard, f"  {shard.queue}", "-", engine.node_of(shard.queue)) for shard in stats.shards
    ]


def masters(engine: Engine, queue: str) -> str:
    """The Cluster masters of ``queue``'s shards, as the client's slot table has them."""
    try:
        return ", ".join(sorted({engine.node_of(shard) for shard in engine.shards(queue)}))
    except DelayJobsError:
        return "unknown"


def unread(engine: Engine, queue: str, stats: QueueStats) -> str:
    """What a queue read in part (``stats``) leaves out: shards, its live workers."""
    lost = ", ".join(missing_shards(engine, queue, stats))
    parts = [f"its shards {lost}"] if lost else []
    parts += ["its live workers"] if stats.live_workers is None else []
    return "not " + " nor ".join(parts)


def checked_names(names: list[str]) -> list[str]:
    """Each name once, in the order given (``--queues a,a`` of the other commands does the
    same); a bad one is refused with exit code 2, as argparse refuses a bad option."""
    for name in names:
        try:
            sharding.parse(name)
        except ValueError as exc:
            raise CommandError(str(exc), returncode=2) from exc
    return list(dict.fromkeys(names))


class Command(SafeOutputCommand):
    help = "Print pending, overdue, ready, in flight, garbage, next due and live workers."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("queues", nargs="*", help="Queues to show (default: all known).")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            engine = get_engine()
            check_socket_timeout(engine, "this command")
            named = checked_names(options["queues"])
            table: list[tuple[str, ...]] = [COLUMNS]
            broken: list[str] = []
            unknown: list[str] = []
            partial: list[str] = []
            try:
                listed: list[str] | None = engine.known_queues()
            except WrongType as exc:  # the queues named can be shown, not told unknown
                if not named:
                    raise
                broken.append(str(exc))
                listed = None
            except EngineUnavailable as exc:  # on a Cluster, the directory's master is down
                if not engine.is_cluster:  # one Redis: every queue's master is down too
                    raise
                configured = {delayjobs_settings.DEFAULT_QUEUE, *delayjobs_settings.QUEUE_SHARDS}
                named = named or sorted({*engine.known_queues(fresh=False), *configured})
                broken.append(f"the directory of queues, so a queue may be missing: {exc}")
                listed = None
            down: dict[str, str] = {}  # Cluster masters that do not answer, asked once
            for queue in named or listed or []:
                try:
                    found = rows(engine, queue, down=down)
                    if (
                        listed is not None
                        and empty(found[0])
                        and not known(engine, queue, set(listed))
                    ):
                        unknown.append(queue)
                        continue
                    table += found
                except PartlyUnavailable as exc:  # a master down: the shards that answer
                    table += rows(engine, queue, exc.done)
                    partial.append(
                        f"queue {queue} is shown in part ({unread(engine, queue, exc.done)}): {exc}"
                    )
                except WrongType as exc:  # that queue alone: the others are shown
                    broken.append(f"queue {queue}: {exc}")
                except EngineUnavailable as exc:  # one Redis: every queue's; on a Cluster,
                    if not engine.is_cluster:  # its master's: the others are shown
                        raise
                    broken.append(f"queue {queue} (master {masters(engine, queue)}): {exc}")
        except (DelayJobsError, ValueError, TypeError) as exc:
            raise CommandError(str(exc)) from exc
        widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS))]
        for r in table:
            self.stdout.write(
                "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
            )
        problems = ["cannot read " + "; ".join(broken)] if broken else []
        problems += partial
        if unknown:
            problems.append(f"unknown queue(s), never held by Redis: {', '.join(unknown)} "
                            f"(known: {', '.join(listed or []) or 'none'})")  # fmt: skip
        if problems:
            raise CommandError("; ".join(problems))
