"""The read side of the engine: shard names and keys, counts, next due and dead ids,
workers, server INFO and time. ``Engine`` adds the moves (engine.py)."""

from __future__ import annotations

import contextlib
import functools
import heapq
import itertools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from functools import partial
from typing import Any, TypeVar, cast

from redis.commands.core import Script
from redis.exceptions import NoScriptError

from . import sharding
from .directory import Directory
from .errors import (
    EngineUnavailable,
    PerShard,
    WrongType,
    guarded,
    replica_refused,
    unreachable,
)
from .keys import QueueKeys, validate_name
from .results import Overview, QueueStats, merge_stats
from .routing import Router
from .sharding import Shard
from .validation import check_batch as _batch
from .validation import check_ids as _ids
from .validation import check_names, wire
from .validation import opt_int as _opt_int
from .validation import score_ms as _score_ms
from .validation import text as _text

Rows = list[tuple[bytes, float]]  # a WITHSCORES reply
#: Salts tried to find a key in a slot of a given master (a master of an even share of
#: the slots takes a few; one of a single slot about 16,384).
MAX_PROBE_SALT = 65_536
T = TypeVar("T")


@functools.lru_cache(maxsize=4096)  # key names (a few per shard) and script digests
def _wired(name: str) -> bytes:
    """A key's name (ASCII: ``validate_name``) or a script's digest as sent to Redis."""
    return wire(name)


def _is_cluster(client: object) -> bool:
    from redis.cluster import RedisCluster

    return isinstance(client, RedisCluster)


def counter_value(value: bytes | str | None) -> int | None:
    """A counter's value; None for one that is missing or not an integer: the scripts
    write nothing else (HINCRBY), but another program may, and one odd field must not make
    every reader of the counters fail (stats, or the metrics' snapshot of them)."""
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _description(raw: bytes | None) -> dict[str, Any]:
    """A worker's description as ``heartbeat`` recorded it; {} for one that is not a JSON
    object (another program's, or another version's)."""
    try:
        found = json.loads(raw or b"{}")
    except ValueError:  # UnicodeDecodeError too
        return {}
    return found if isinstance(found, dict) else {}


def _soonest(replies: Sequence[Rows], limit: int) -> list[tuple[str, int]]:
    """The first ``limit`` (id, due ms) of the shards' ZRANGE WITHSCORES replies."""
    found = [[(_text(id_), _score_ms(score)) for id_, score in rows] for rows in replies]
    return list(heapq.merge(*found, key=lambda row: row[1]))[:limit]


def _latest(replies: Sequence[Rows], limit: int) -> list[tuple[str, int]]:
    """The last ``limit`` (id, ms) of the shards' ZREVRANGE WITHSCORES replies."""
    found = [(_text(id_), _score_ms(score)) for rows in replies for id_, score in rows]
    return sorted(found, key=lambda row: -row[1])[:limit]


def _workers(alive: Rows, info: Mapping[bytes, bytes]) -> list[dict[str, Any]]:
    """Live workers (id, heartbeat expiry) with their descriptions."""
    return [
        {**_description(info.get(w)), "id": _text(w), "expires_ms": _score_ms(s)} for w, s in alive
    ]


def _as_unavailable(exc: Exception) -> EngineUnavailable:
    """A Redis error a pipeline returned, as the ``EngineUnavailable`` ``guarded`` gives."""

    def fail() -> None:
        raise exc

    try:
        guarded(fail)
    except EngineUnavailable as wrapped:
        return wrapped
    raise AssertionError("guarded() returned for an error")  # pragma: no cover


class Reader:
    """What every engine method stands on: the client, the shard router, error wrapping."""

    _scripts: dict[str, Script]

    def __init__(self, client: Any, prefix: str, shards: Mapping[str, int] | int) -> None:
        self.client = client
        self.prefix = validate_name(prefix, "prefix")
        self.is_cluster = _is_cluster(client)
        self._probe_tags: dict[str, int] = {}  # master -> salt of its write-probe key
        directory = Directory(client, self.queues_key, self._call, one_server=not self.is_cluster)
        self._router = Router(self.prefix, shards, directory)

    def _call(self, fn: Callable[[], T]) -> T:
        """``fn()``; every Redis error becomes ``EngineUnavailable`` (see ``guarded``).

        After a failover behind one address (a DNS name, a proxy) the connections still
        open reach the old master, now a replica that refuses every write (READONLY) for
        as long as they stay open, while new ones reach the new master: a refusal of that
        kind closes them all, so the next call connects anew.
        """
        try:
            return guarded(fn)
        except EngineUnavailable as exc:
            if not self.is_cluster and replica_refused(exc):
                self.client.connection_pool.disconnect()
            raise

    @property
    def queues_key(self) -> str:
        # Outside every queue's hash tag on purpose: a directory, written beside the
        # scripts (not inside them) so each script still touches a single slot.
        return f"{{{self.prefix}}}:queues"

    def _run(self, name: str, keys: Sequence[str], args: Sequence[str | bytes | float]) -> Any:
        script = self._scripts[name]
        # As bytes: an id read back that is not UTF-8 holds surrogate escapes (see ``text``),
        # which the client's strict encoding would refuse.
        args = [wire(arg) if isinstance(arg, str) else arg for arg in args]
        # The keys and the digest too, encoded once per name rather than by the client on
        # every call (about 6 Python calls each; an add names 9 keys). The same bytes.
        wired = [*map(_wired, keys)]

        def run() -> Any:
            try:
                return self.client.evalsha(_wired(script.sha), len(wired), *wired, *args)
            except NoScriptError:
                # EVAL, not redis-py's SCRIPT LOAD: on a Cluster that goes to every master,
                # so one master that is down would stop every shard's first run of a
                # script. EVAL goes to the shard's master only and caches the script there.
                return self.client.eval(script.script, len(wired), *wired, *args)

        return self._call(run)

    # -- shards --------------------------------------------------------------------

    def shard_count(self, queue: str) -> int:
        """How many shards new ids of ``queue`` are spread over."""
        return self._router.count(queue)

    def shards(self, queue: str) -> list[str]:
        """The shards of ``queue`` to serve: its current count's, then any older ones the
        directory still lists (they hold ids added before the count changed)."""
        return [self._router.name(shard) for shard in self._router.served(queue)]

    def old_shards(self, queue: str) -> list[str]:
        """The shards of older counts that the directory still lists (see ``shards()``)."""
        return [self._router.name(shard) for shard in self._router.stale(queue)]

    def home(self, queue: str, job_id: str) -> str:
        """The shard that holds (or will hold) ``job_id`` of ``queue``."""
        return self._router.home(queue, _ids([job_id])[0]).name

    def keys(self, name: str) -> QueueKeys:
        """The keys of a shard (a queue name: the keys of its shard of 1, where the live
        workers of the queue are recorded whatever its count)."""
        return self._keys(sharding.parse(name))

    def _keys(self, shard: Shard) -> QueueKeys:
        return self._router.keys(shard)

    def list_shards(self, queue: str) -> None:
        """List the shards of ``queue``'s current count in the directory again. An add lists
        a shard only when it finds it empty: a directory lost on its own (on a Cluster, its
        master lost its data and the shards' masters did not) would leave the queue out of
        ``known_queues`` (the metrics, ``delayjobs_stats``) until it had emptied."""
        self._router.directory.register_all(sharding.shards(queue, self._router.count(queue)))

    def forget_empty_shards(
        self, queue: str,
        guard: Callable[[str], AbstractContextManager[Any]] = lambda name: contextlib.nullcontext(),
    ) -> list[str]:  # fmt: skip
        """Drop from the directory the shards of older counts that hold nothing; return them.

        An old process may add to such a shard meanwhile: its add finds the shard empty
        and lists it again, and a shard found not empty after it was dropped is listed
        again here, so a shard that holds ids is never left unlisted. A shard that cannot
        be reached is left listed (``PartlyUnavailable`` once the others are done), as one
        is that ``guard`` (given its name, around the first look at it: the calls after it
        reach other masters too) refuses.
        """
        forgotten: list[str] = []
        directory = self._router.directory
        each = PerShard()
        for shard in self._router.stale(queue):
            with each.attempt():
                with guard(self._router.name(shard)):
                    empty = self._empty(shard)
                if not empty:
                    continue
                self._fold_counters(shard, sharding.shards(queue, self._router.count(queue))[0])
                directory.forget(shard)
                if self._empty(shard):
                    forgotten.append(self._router.name(shard))
                else:
                    directory.register(shard)
        each.check(forgotten)
        return forgotten

    def _fold_counters(self, shard: Shard, into: Shard) -> None:
        """Move the counters of ``shard`` (about to be forgotten) into those of ``into``, a
        shard of the current count: the queue's totals are the sum over its served shards,
        and exported as Prometheus counters, which must never go down (nor jump).

        Every promoter forgets the empty shards, so two may fold the same shard at once:
        the counts are taken from ``shard`` by one script (``fold_counters``), and a second
        taker finds nothing left. On one Redis the same script adds them to ``into``: one
        atomic step. On a Cluster the two shards may be on two masters, so they are added
        by a second script (``add_counts``); the counts it cannot add (their field in
        ``into`` holds another program's value, which one Redis leaves alone too) are put
        back into ``shard``, and so are all of them if it fails (``shard`` stays listed, so
        the next fold moves them; the failure is raised). What is left: a read between the
        two calls sees the totals short by these counts for that instant; a process that
        dies between them loses them (the totals drop once), and so does one whose put-back
        fails too (raised, with the counts); an add to ``into`` whose reply was lost after
        it was applied is put back too, and the counts are counted twice.
        """
        source, target = self._keys(shard).counters, self._keys(into).counters
        if not self.is_cluster:
            self._run("fold_counters", [source, target], [])
            return
        taken = self._run("fold_counters", [source], [])
        if not taken:
            return
        try:
            refused = self._run("add_counts", [target], taken)
        except EngineUnavailable as exc:
            self._put_back(source, taken, exc)
            raise
        if refused:
            self._put_back(source, refused, None)

    def _put_back(self, key: str, flat: list[bytes], exc: EngineUnavailable | None) -> None:
        """Give a shard back the counts (``flat``: name, count, ...) taken from it for a
        fold that failed (``exc``) or could not add them; raise if some stay lost."""
        cause: EngineUnavailable | None = None
        try:
            lost = self._run("add_counts", [key], flat)
        except EngineUnavailable as again:
            lost, cause = flat, again
        if lost:
            counts = {_text(lost[i]): _text(lost[i + 1]) for i in range(0, len(lost), 2)}
            why = cause or "their fields there hold another program's values now"
            raise EngineUnavailable(
                f"the counters {counts} of {key} could not be folded "
                f"({exc or 'refused by the new shard'}) nor put back ({why}): the queue's "
                "totals lose them"
            ) from cause

    def _empty(self, shard: Shard) -> bool:
        s = self._stats(shard)
        return s.pending + s.ready + s.in_flight + s.garbage == 0

    # -- observing -----------------------------------------------------------------

    def stats(self, queue: str, down: dict[str, str] | None = None) -> QueueStats:
        """Return counts and times of one queue (summed over its shards, each read
        atomically; the shards' own figures in ``shards``). With ``down`` (see
        ``masters``), a shard on a Cluster master listed there is not asked (it counts as
        failed), and a master that does not answer goes into it: a reader of many queues
        waits for a frozen master once, not once per shard on it. Live workers that cannot
        be read (the master of the queue's own name down) are None, in a
        ``PartlyUnavailable``."""
        shards = self._router.targets(queue)
        if shards == [Shard(shards[0].queue)]:
            return replace(self._unless_down(shards[0], down, partial(self._stats, shards[0])),
                           queue=queue)  # fmt: skip
        # A master that is down hides only its shards: PartlyUnavailable, with the counts
        # of the others (their ``shards``), then none but those answered.
        each = PerShard(one_server=not self.is_cluster)
        parts = tuple(p for s in shards
                      if (p := each.run(partial(self._unless_down, s, down,
                                                partial(self._stats, s)), None)))  # fmt: skip
        if not parts:
            each.check()
        # Live workers are recorded in the keys of the queue's shard of 1 (heartbeat); with
        # its master down they are unknown (None): 0 would page for workers that are fine.
        now = max(p.now_ms for p in parts)
        workers = self._keys(Shard(shards[0].queue)).workers
        count = partial(self._call, partial(self.client.zcount, workers, now + 1, "+inf"))
        live = each.run(partial(self._unless_down, Shard(shards[0].queue), down, count), None)
        if len(parts) == 1 and each.failure is None:
            return replace(parts[0], queue=queue, live_workers=int(live))
        merged = merge_stats(queue, parts, None if live is None else int(live))
        each.check(merged)
        return merged

    def _unless_down(self, shard: Shard, down: dict[str, str] | None, fn: Callable[[], T]) -> T:
        """``fn()``, a call to the master of ``shard``; with ``down``, not made when that
        master is listed there (its failure is raised), and listed if it does not answer."""
        if down is None or not self.is_cluster:
            return fn()
        master = self.node_of(self._router.name(shard))
        if master in down:
            raise EngineUnavailable(f"{down[master]} (master {master}, not asked again)")
        try:
            return fn()
        except EngineUnavailable as exc:
            if unreachable(exc):
                down.setdefault(master, str(exc))
            raise

    def _stats(self, shard: Shard) -> QueueStats:
        return self._parse_stats(shard, self._run("stats", self._stats_keys(shard), []))

    def _stats_keys(self, shard: Shard) -> list[str]:
        k = self._keys(shard)
        return [k.pending, k.ready_set, k.unack, k.garbage, k.workers, k.counters]

    def _parse_stats(self, shard: Shard, reply: list[Any]) -> QueueStats:
        now, pend, overdue, ready, flight, expired, garb, live, nxt, lease, flat = reply
        counters = {_text(flat[i]): n for i in range(0, len(flat), 2)
                    if (n := counter_value(flat[i + 1])) is not None}  # fmt: skip
        return QueueStats(
            self._router.name(shard), int(now), int(pend), int(overdue), int(ready), int(flight),
            int(expired), int(garb), int(live), _opt_int(nxt), _opt_int(lease), counters,
        )  # fmt: skip

    def next_due(
        self, queue: str, limit: int = 10, down: dict[str, str] | None = None
    ) -> list[tuple[str, int]]:
        """Return the ``limit`` pending ids due soonest, with their due times (ms). With
        ``down``, as in ``stats``: a master listed there is not asked."""
        last = _batch(limit) - 1
        found: list[Rows] = []
        # A master that is down: PartlyUnavailable, with the others' ids.
        each = PerShard(one_server=not self.is_cluster)
        for shard in self._router.targets(queue):
            read = partial(self.client.zrange, self._keys(shard).pending, 0, last, withscores=True)
            call = partial(self._unless_down, shard, down, partial(self._call, read))
            found.append(cast(Rows, each.run(call, [])))
        soonest = _soonest(found, last + 1)
        each.check(soonest)
        return soonest

    def known_queues(self, *, fresh: bool = True) -> list[str]:
        """Return every queue that was ever added to (since the last flush), sorted; not
        ``fresh``: those the directory listed when this engine last read it, asking Redis
        nothing (its master may be down)."""
        directory = self._router.directory
        return sorted(directory.listed(fresh=True) if fresh else directory.last())

    def garbage(
        self, queue: str, limit: int = 100, down: dict[str, str] | None = None
    ) -> list[tuple[str, int]]:
        """Return the most recently buried ids with their time of death (ms). With
        ``down``, as in ``stats``: a master listed there is not asked."""
        last = _batch(limit) - 1
        found: list[Rows] = []
        each = PerShard(one_server=not self.is_cluster)  # as in next_due
        for shard in self._router.targets(queue):
            read = partial(self.client.zrevrange, self._keys(shard).garbage, 0, last, True)
            call = partial(self._unless_down, shard, down, partial(self._call, read))
            found.append(cast(Rows, each.run(call, [])))
        latest = _latest(found, last + 1)
        each.check(latest)
        return latest

    def garbage_ids(self, queue: str, count: int = 1000) -> Iterator[list[str]]:
        """Yield the buried ids of every shard of ``queue`` (listed ones of older counts
        too), a chunk of about ``count`` at a time. Read with ZSCAN: an id buried or taken
        out meanwhile may be missed, none held throughout is."""
        for shard in self._router.targets(queue):
            key, cursor = self._keys(shard).garbage, 0
            while True:
                cursor, rows = self._call(partial(self.client.zscan, key, cursor, None, count))
                if rows:
                    yield [_text(id_) for id_, _score in rows]
                if not cursor:
                    break

    def workers(self, queue: str, down: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """Return the live workers of a queue: their description and heartbeat expiry.
        With ``down``, as in ``stats``: a master listed there is not asked."""
        home = Shard(sharding.parse(queue).queue)
        k = self._keys(home)

        def run() -> tuple[Rows, dict[bytes, bytes]]:
            now_ms = self.server_time_ms()
            alive = self.client.zrangebyscore(k.workers, now_ms + 1, "+inf", withscores=True)
            return cast(Rows, alive), cast(dict[bytes, bytes], self.client.hgetall(k.worker_info))

        return _workers(*self._unless_down(home, down, partial(self._call, run)))

    def overview(
        self, queues: Sequence[str], *, next_due: int = 10, garbage: int = 100
    ) -> dict[str, Overview | EngineUnavailable]:
        """Return, for each of ``queues``, what ``stats``, ``next_due``, ``garbage`` and
        ``workers`` return, read in one pipeline: one round trip for them all, where those
        take about seven calls per queue. Each shard's counts are still one atomic
        script. A queue whose keys cannot be read (a key of the wrong type) gets its
        error; raises ``EngineUnavailable`` if the pipeline fails as a whole (Redis does
        not answer), and at once on a Cluster: redis-py refuses ``EVALSHA`` in a Cluster
        pipeline (the caller then reads queue by queue)."""
        due, dead = _batch(next_due), _batch(garbage)
        plan = [(queue, self._router.targets(queue)) for queue in check_names(queues)]

        def run(send: str) -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for queue, shards in plan:
                for shard in shards:
                    k = self._keys(shard)
                    keys = self._stats_keys(shard)
                    script = self._scripts["stats"]
                    if send == "evalsha":
                        pipe.evalsha(script.sha, len(keys), *keys)
                    else:  # the server lost it (a restart): EVAL caches it again
                        pipe.eval(script.script, len(keys), *keys)
                    pipe.zrange(k.pending, 0, due - 1, withscores=True)
                    pipe.zrevrange(k.garbage, 0, dead - 1, withscores=True)
                k = self._keys(Shard(queue))
                pipe.zrange(k.workers, 0, -1, withscores=True)  # expired ones: left out below
                pipe.hgetall(k.worker_info)
            return cast(list[Any], pipe.execute(raise_on_error=False))

        replies = self._call(partial(run, "evalsha"))
        if any(isinstance(reply, NoScriptError) for reply in replies):
            replies = self._call(partial(run, "eval"))
        found: dict[str, Overview | EngineUnavailable] = {}
        at = 0
        for queue, shards in plan:
            size = 3 * len(shards) + 2
            mine, at = replies[at : at + size], at + size
            failed = next((r for r in mine if isinstance(r, Exception)), None)
            if failed is not None:
                found[queue] = _as_unavailable(failed)
                continue
            parts = tuple(self._parse_stats(s, mine[3 * i]) for i, s in enumerate(shards))
            now = max(p.now_ms for p in parts)
            live = [(w, score) for w, score in mine[-2] if score > now]
            if len(parts) == 1 and shards == [Shard(shards[0].queue)]:
                stats = replace(parts[0], queue=queue)
            elif len(parts) == 1:
                stats = replace(parts[0], queue=queue, live_workers=len(live))
            else:
                stats = merge_stats(queue, parts, len(live))
            found[queue] = Overview(
                stats,
                _soonest(mine[1 : 3 * len(shards) : 3], due),
                _latest(mine[2 : 3 * len(shards) : 3], dead),
                _workers(live, mine[-1]),
            )
        return found

    def info(self) -> dict[str, Any]:
        """Return Redis's ``INFO`` (version, memory policy, ...); on a Cluster, one node's."""
        return self._call(self.client.info)

    def masters(
        self, down: dict[str, str] | None = None, before: Callable[[str], None] | None = None
    ) -> dict[str, dict[str, Any]]:
        """Return ``INFO`` of every master by its address (one Redis: just that one).

        With ``down``, a master of a Cluster that is not reached or does not answer goes
        into it (its address, with why) instead of failing the call, as long as another
        master answers: the queues on the others can still be served. ``before`` is called
        with a master's address ("" on one Redis) before it is asked (an error it raises
        ends the call)."""
        if not self.is_cluster:
            if before is not None:
                before("")
            return {"": self.info()}

        def read() -> dict[str, dict[str, Any]]:
            # One node at a time: redis-py gives a command sent to several nodes as
            # {node: reply}, but one sent to a single node (a Cluster of one master) bare.
            found: dict[str, dict[str, Any]] = {}
            first: EngineUnavailable | None = None
            for node in self._call(self.client.get_primaries):
                if before is not None:
                    before(node.name)
                try:
                    found[node.name] = self._call(partial(self.client.info, target_nodes=node))
                except EngineUnavailable as exc:
                    if down is None or not unreachable(exc):
                        raise
                    down[node.name], first = str(exc), first or exc
            if first is not None and not found:
                raise first  # none answers: Redis is unavailable
            return found

        found = read()
        if any(info.get("role", "master") != "master" for info in found.values()):
            # A master of the client's slot table is a replica now: a failover the client
            # has not heard of (nothing it sent met a MOVED, as in a process that only
            # checks health), and the old master is back as a replica. Read the table anew.
            self._call(self.client.nodes_manager.initialize)
            if down is not None:
                down.clear()
            found = read()
        return found

    def refused_write(
        self, down: dict[str, str] | None = None, before: Callable[[str], None] | None = None
    ) -> tuple[str, EngineUnavailable] | None:
        """Ask every master for a write that changes nothing; return the first one that
        refuses (its address, "" on one Redis) with its refusal, or None. Raise
        ``EngineUnavailable`` if a master does not answer; with ``down`` (see ``masters``),
        a master of a Cluster listed there is not asked, and one that does not answer goes
        into it.

        A master that takes no write refuses it, as it refuses every write, while its
        ``INFO`` reads as usual: MISCONF (a failed RDB save or AOF write, with
        ``stop-writes-on-bgsave-error``), NOREPLICAS (fewer good replicas than
        ``min-replicas-to-write``, which ``PING`` does not show), OOM (at ``maxmemory``
        with nothing it may evict: a ``volatile-*`` policy and no key with a time to live,
        as the jobs' keys have none). The write is ``SETRANGE`` of nothing on a key that
        does not exist: it creates no key and is not replicated, and Redis refuses it when
        full, as it refuses every command that may grow memory (a ``DEL`` it would run).
        Redis refuses before it runs a command: a key of another type (another program's)
        answers ``WRONGTYPE``, having taken the write. ``before``: as for ``masters``."""
        if not self.is_cluster:
            targets = [("", f"{{{self.prefix}}}:write-probe")]
        else:
            nodes = self._call(self.client.get_primaries)
            targets = [(node.name, self._probe_key(node.name)) for node in nodes
                       if down is None or node.name not in down]  # fmt: skip
        for address, key in targets:
            if before is not None:
                before(address)
            try:
                self._call(partial(self.client.setrange, key, 0, b""))
            except WrongType:  # another program's key: Redis refuses before it runs a write
                continue
            except EngineUnavailable as exc:
                if not unreachable(exc):
                    return address, exc
                if down is None or not self.is_cluster:
                    raise
                down[address] = str(exc)
        return None

    def _probe_key(self, node: str) -> str:
        """A key in a slot that the master ``node`` serves (by the client's slot table)."""
        owners = self.client.nodes_manager.slots_cache
        found = self._probe_tags.get(node)
        for salt in itertools.chain([] if found is None else [found], range(MAX_PROBE_SALT)):
            key = f"{{{self.prefix}:write-probe~{salt}}}"
            held_by = owners.get(self.client.keyslot(key))
            if held_by and held_by[0].name == node:
                self._probe_tags[node] = salt
                return key
        # None hashes to its slots (a master of a very few): this key's master is asked
        # again instead, and this one's INFO is all that is checked.
        return f"{{{self.prefix}}}:write-probe"

    def node_of(self, name: str) -> str:
        """The address of the master that holds a shard ("" on one Redis)."""
        if not self.is_cluster:
            return ""
        key = self.keys(name).pending
        return str(self._call(lambda: self.client.get_node_from_key(key).name))

    def server_time_ms(self) -> int:
        """Return Redis's clock in ms: the clock every due time is compared with."""
        seconds, micros = self._call(self.client.time)
        return int(seconds) * 1000 + int(micros) // 1000
