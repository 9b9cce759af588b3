"""The engine: typed Python methods over one Lua script per move. Pure redis-py."""

from __future__ import annotations

import itertools
import json
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import cache, partial
from importlib import resources
from typing import Any

from redis.commands.core import Script

from . import sharding
from .claims import ClaimToken, record_ms
from .errors import EngineUnavailable, PartlyUnavailable, PerShard, WrongType
from .keys import QueueKeys, validate_name
from .leases import Holder, check_leases
from .reader import Reader
from .results import Added, Leased, PromoteResult, merge_promoted
from .sharding import Shard
from .validation import MAX_BATCH as MAX_BATCH
from .validation import MAX_DUE_MS, brief, check_names, is_id
from .validation import check_batch as _batch
from .validation import check_due as _due
from .validation import check_dues as _dues
from .validation import check_ids as _ids
from .validation import check_ms as _ms
from .validation import check_priorities as _priorities
from .validation import score_ms as _score_ms
from .validation import text as _text
from .waiting import Waiter, check_timeout, waiter

_SCRIPTS = (
    "add",
    "remove",
    "reschedule",
    "promote",
    "claim",
    "extend_lease",
    "adopt",
    "withdraw",
    "ack",
    "nack",
    "bury",
    "requeue",
    "purge",
    "recover_expired",
    "stats",
    "heartbeat",
    "fold_counters",
    "add_counts",
)


@cache
def script_source(name: str) -> str:
    """Return the Lua source of one script shipped in ``engine/scripts``."""
    return resources.files(__package__).joinpath("scripts", f"{name}.lua").read_text()


# Redis does not roll a script back: one that meets a key of another type (another
# program's SET on a queue's key) after its first write would leave that write behind
# (claim popped ids from ready, then failed on ready_set, and the ids were lost). So each
# script first checks every key against the type its header gives it, and the error names
# the key. TYPE is O(1), inside the script: no round trip.
_TYPE_CHECK = """\
local expected = {%s}
for i = 1, #KEYS do
  local found = redis.call('TYPE', KEYS[i])['ok']
  if found ~= 'none' and found ~= expected[i] then
    return redis.error_reply('WRONGTYPE ' .. KEYS[i] .. ' holds a ' .. found .. ', not a '
      .. expected[i] .. ' (another program wrote it?): the queue cannot be served until it '
      .. 'is deleted or renamed')
  end
end
"""


@cache
def checked_source(name: str) -> str:
    """The source of a script as it is loaded: its keys' types checked first (the types
    read from its header, ``-- KEYS[n] = name TYPE``)."""
    source = script_source(name)
    types = dict(re.findall(r"KEYS\[(\d+)\] = \w+ (ZSET|LIST|SET|HASH|STRING)\b", source))
    if not types or sorted(map(int, types)) != list(range(1, len(types) + 1)):
        raise AssertionError(f"{name}.lua: its header gives no type for some KEYS")
    listed = ", ".join(f"'{types[str(n)].lower()}'" for n in range(1, len(types) + 1))
    return _TYPE_CHECK % listed + source


def close_client(client: Any) -> None:
    """Close a client's connections. A ``RedisCluster``'s ``close()`` leaves the pools of
    its per-master clients open (redis-py 8 gives them ``auto_close_connection_pool =
    False``): their sockets would linger until garbage collection, so close them too."""
    client.close()
    nodes = client.get_nodes() if hasattr(client, "get_nodes") else []
    for node in nodes:
        if node.redis_connection is not None:
            node.redis_connection.connection_pool.disconnect()


class Engine(Reader):
    """The delay queue of one Redis database or one Redis Cluster.

    Ids and times only: the payload of a job lives elsewhere (the Django layer keeps it
    in the database). Times are milliseconds since the epoch; every due-time comparison
    happens inside Redis against its ``TIME``.

    ``shards`` splits queues over several hash tags (see ``sharding.py``): a mapping of
    queue name -> count (1 for queues it leaves out), or one count for every queue. Every
    method takes a queue name or a shard name (``orders#2/6``). Given a queue name, a
    method that takes ids sends each id to its shard, and one that does not (promote,
    claim, stats...) works on every shard the queue has (see ``shards()``).
    """

    def __init__(self, client: Any, prefix: str = "delayjobs",
                 shards: Mapping[str, int] | int = 1) -> None:  # fmt: skip
        super().__init__(client, prefix, shards)
        self._scripts: dict[str, Script] = {
            name: client.register_script(checked_source(name)) for name in _SCRIPTS
        }
        self._waiter: Waiter = waiter(client, self.is_cluster)
        # Per queue: one turn for all would step a queue by the queues claimed between.
        self._turns: defaultdict[str, Iterator[int]] = defaultdict(itertools.count)
        # The fraction of a ms every lease this engine sets ends in (leases.py).
        self._holder = Holder()

    def close(self) -> None:
        """Stop waiting threads and close the client's connections."""
        self._waiter.close()
        close_client(self.client)

    # -- scheduling --------------------------------------------------------------

    def add(
        self,
        queue: str,
        items: Mapping[str, float],
        priorities: Mapping[str, int] | None = None,
        *,
        only_earlier: bool = False,
    ) -> Added:
        """Add ids with due times (ms); return the ids Redis did not hold before.

        ``priorities`` (id -> -100..100, 0 for ids left out): among ids that enter ready
        together (one promote call, or one add of ids due now), higher goes first.
        ``only_earlier``: an id already pending keeps its due time unless the one given is
        earlier (reconcile's due times may be older than those added since).

        Given a queue name after its shard count changed, an id still waiting in a shard of
        an older count is moved to its shard under the current count (``moved`` of the
        result), and one in flight or in garbage there is left alone, as an add leaves
        alone an id its own shard holds so: an id is never held by two shards at once.

        A shard that cannot be reached does not stop the others: their ids are added, then
        ``PartlyUnavailable`` is raised with the list of ids added as ``done``.
        """
        if not isinstance(only_earlier, bool):  # a truthy 2 would be read as False
            raise TypeError(f"only_earlier must be a bool, not {type(only_earlier).__name__}")
        dues = _dues(items)
        ranks = _priorities(priorities, dues)
        added: set[str] = set()
        each = PerShard()
        older = self._older(queue, [], each, first=True)  # none unless the count changed
        waiting, busy = self._withdraw(older, list(dues), False, each)
        reached: list[str] = []
        for shard, ids in self._router.route(queue, [id_ for id_ in dues if id_ not in busy]):
            if not ids:  # every one in flight or in garbage in a shard of an older count
                continue
            k = self._keys(shard)
            keys = [k.pending, k.ready, k.ready_set, k.unack, k.garbage, k.wake, k.notify,
                    k.counters, k.priority]  # fmt: skip
            args: list[str | float] = [int(only_earlier)]
            args += [value for id_ in ids for value in (id_, dues[id_], ranks[id_])]
            with each.attempt():
                was_empty, new = self._run("add", keys, args)
                added.update(_text(id_) for id_ in new)
                reached += ids
                if was_empty:
                    # The directory lies outside the queue's hash tag, so the script cannot
                    # write it; a shard is listed from the first add that finds it empty
                    # (after a flush too), which keeps the common add at one round trip.
                    # The ids are added even if that fails: PartlyUnavailable, not a loss.
                    try:
                        self._router.directory.register(shard)
                    except EngineUnavailable as exc:
                        each.skip(exc)
        moved = self._leave_older(queue, older, [id_ for id_ in reached if id_ in waiting], each)
        result = Added((id_ for id_ in dues if id_ in added and id_ not in waiting),
                       moved=(id_ for id_ in dues if id_ in moved))  # fmt: skip
        each.check(result)
        return result

    def _withdraw(
        self, shards: list[Shard], ids: list[str], take: bool, each: PerShard
    ) -> tuple[set[str], set[str]]:
        """Look for ``ids`` in ``shards`` (of older counts): return those waiting there
        (taken out, with ``take``) and those in flight or in garbage there. A shard that
        cannot be reached is noted in ``each`` and passed over."""
        waiting: set[str] = set()
        busy: set[str] = set()
        for shard in shards:
            rest = [id_ for id_ in ids if id_ not in waiting and id_ not in busy]
            if not rest:
                break
            k = self._keys(shard)
            keys = [k.pending, k.ready_set, k.unack, k.garbage, k.counters, k.priority]
            with each.attempt():
                found, held = self._run("withdraw", keys, [int(take), *rest])
                waiting.update(_text(id_) for id_ in found)
                busy.update(_text(id_) for id_ in held)
        return waiting, busy

    def _leave_older(
        self, queue: str, older: list[Shard], ids: list[str], each: PerShard
    ) -> set[str]:
        """Take ``ids``, just added to their current shard, out of the shards of older
        counts where they waited; return those taken out. Added first, taken out second:
        an add that fails (a full Redis, a master down) leaves the id where it was. An id a
        worker claimed from its old shard in between is taken out of its new one again."""
        if not ids:
            return set()
        taken, claimed = self._withdraw(older, ids, True, each)
        if claimed:
            each.run(partial(self.remove, queue, list(claimed)), 0)
        return taken

    def remove(self, queue: str, ids: Iterable[str]) -> int:
        """Remove ids not yet claimed (pending or ready); return how many were removed.
        (A shard that cannot be reached: ``PartlyUnavailable``, as ``add`` says.)"""

        def run(shard: Shard, part: list[str]) -> int:
            return int(self._run("remove", self._remove_keys(self._keys(shard)), part))

        return self._at_home(queue, _ids(ids), run)

    @staticmethod
    def _remove_keys(k: QueueKeys) -> list[str]:
        return [k.pending, k.ready_set, k.counters, k.priority]

    def reschedule(self, queue: str, id: str, due_ms: float) -> bool:
        """Move a still-pending id to a new due time; False if it already left pending."""
        args: list[str | float] = [*_ids([id]), _due(due_ms)]
        [(home, _)] = self._router.route(queue, [id])

        def run(shard: Shard) -> bool:
            k = self._keys(shard)
            return bool(
                self._run("reschedule", [k.pending, k.ready, k.ready_set, k.wake, k.notify], args)
            )

        # The shards of older counts (read from the directory) only for an id not at home.
        return run(home) or any(run(shard) for shard in self._router.others(queue, [home]))

    # -- the promoter --------------------------------------------------------------

    def promote(self, queue: str, batch: int = 1000) -> PromoteResult:
        """Move up to ``batch`` due ids into ready; report when the next one is due.

        Given a queue of several shards: up to ``batch`` from each, and the earliest
        next due time over all of them.
        """
        args = [_batch(batch)]
        results = []
        for shard in self._router.targets(queue):
            k = self._keys(shard)
            keys = [k.pending, k.ready, k.ready_set, k.notify, k.priority]
            moved, now, *rest = self._run("promote", keys, args)
            if not rest:
                results.append(PromoteResult(int(moved), int(now), None))
            else:
                results.append(
                    PromoteResult(int(moved), int(now), _score_ms(rest[0]), int(rest[1]))
                )
        return merge_promoted(results)

    def recover_expired(self, queue: str, batch: int = 1000) -> list[str]:
        """Put ids whose lease ran out back at the head of ready; return them."""
        args = [_batch(batch)]
        recovered = []
        for shard in self._router.targets(queue):
            k = self._keys(shard)
            keys = [k.unack, k.ready, k.ready_set, k.notify, k.counters]
            recovered += [_text(i) for i in self._run("recover_expired", keys, args)]
        return recovered

    def wait_for_wake(self, queues: Sequence[str], timeout: float) -> bool:
        """Block until a job due earlier than the known earliest is added, or ``timeout``.

        Redis checks blocking timeouts about every 100 ms (``hz 10``), so a caller that
        needs a precise wake-up time sleeps the last stretch itself. The wait never
        outlasts the client's socket timeout (see ``waiting.py``): False may come early.
        """
        return self._wait(queues, "wake", timeout)

    # -- the worker ----------------------------------------------------------------

    def claim(
        self, queue: str, count: int = 1, lease_ms: float = 300_000,
        token: ClaimToken | None = None,
    ) -> Leased:  # fmt: skip
        """Move up to ``count`` ids from ready into flight with a lease; return them, with
        the lease each is in flight under (``Leased.leases``: see ``extend_lease``) and the
        shard each came from (``Leased.shards``).

        Entries left in ready by ``remove`` are skipped. One call skips at most 1000 of
        them, so it may return fewer ids than ready holds; it then leaves a work token,
        and ``wait_for_work`` returns at once. Given a queue of several shards, the
        shards are tried in turn, starting one further at each call, until ``count``.

        With a ``token`` (see claims.py), a call whose reply was lost can be sent again
        with the same token: on each shard where Redis ran it, it returns the ids it took
        there (however many) that are still in flight under its lease, and takes none.

        A shard that fails after others gave ids (or after members were dropped, below)
        ends the claim: those ids are returned, with the error as ``Leased.failure``
        (raised, they would be in flight for nobody until their lease ended); one that
        fails before is raised. A member no other call takes (another program's: see
        ``check_ids``) is taken out of flight again, in a second call made only then, and
        named in ``Leased.dropped``, not returned; that call failing ends the claim too,
        which returns what it took with the error (one Redis that does not answer costs
        a claim one timeout, not one a shard).
        """
        want, lease = _batch(count), _ms(lease_ms, "lease")
        # Exactly a ClaimToken: a subclass may skip the checks that make one.
        if token is not None and type(token) is not ClaimToken:
            raise TypeError(f"token must be a ClaimToken, not {type(token).__name__}")
        shards = self._router.targets(queue)
        start = next(self._turns[queue]) % len(shards)
        claimed: dict[str, str] = {}
        where: dict[str, str] = {}  # id -> the name of the shard it came from
        replayed: list[str] = []  # returned by a call sent again: leased when first run
        dropped: list[str] = []
        for shard in shards[start:] + shards[:start]:
            k = self._keys(shard)
            keys = [k.ready, k.ready_set, k.unack, k.notify]
            args: list[str | int] = [want - len(claimed), lease, self._holder.fraction]
            if token is not None:
                keys.append(k.claims(token.claimer))
                args += [token.call, record_ms(lease)]
            try:
                deadline, ids, *again = self._run("claim", keys, args)
            except EngineUnavailable as exc:
                if not claimed and not dropped:
                    raise
                return Leased(claimed, where, replayed, dropped, exc)
            taken = [_text(i) for i in ids]
            refused = [i for i in taken if not is_id(i)]
            taken = [i for i in taken if is_id(i)] if refused else taken
            if again:
                replayed += taken
            claimed.update(dict.fromkeys(taken, _text(deadline)))
            where.update(dict.fromkeys(taken, self._router.name(shard)))
            if refused:
                # Out of flight again. Not answered, they stay there until their lease
                # ends, and the claim that takes them again tries again.
                try:
                    self._run("ack", [k.unack, k.counters, k.priority], refused)
                except EngineUnavailable as exc:
                    return Leased(claimed, where, replayed, dropped, exc)
                dropped += refused
            if len(claimed) >= want:  # a call sent again returns what it took
                break
        return Leased(claimed, where, replayed, dropped)

    def wait_for_work(self, queues: Sequence[str], timeout: float) -> bool:
        """Block until ids enter ready on one of ``queues``, or ``timeout`` seconds pass.

        The wait never outlasts the client's socket timeout (see ``waiting.py``): False
        may come early.
        """
        return self._wait(queues, "notify", timeout)

    def extend_lease(
        self, queue: str, ids: Iterable[str] | Mapping[str, str | None], lease_ms: float
    ) -> Leased:
        """Renew the lease of ids still in flight; return those (the rest were lost), with
        their new leases (``Leased.leases``).

        Given a mapping of id -> the lease its holder holds (as the claim, or the last
        extension, returned it), an id is extended only while it is still in flight under
        that lease, or under another lease of this engine's (an extension whose reply was
        lost moved it): one that was lost and claimed again by another worker is in flight
        under that worker's lease, and is reported lost (see leases.py). An id mapped to
        None, or given in a plain list, is extended whoever holds it; a ``Leased`` (what a
        claim or an extension returned) is taken as its ``leases``.
        """
        lease, leases, extended = _ms(lease_ms, "lease"), check_leases(ids), {}
        for shard, part in self._router.route(queue, list(leases)):
            args: list[str | int] = [lease, self._holder.fraction]
            args += [value for id_ in part for value in (id_, leases[id_])]
            reply = self._run("extend_lease", [self._keys(shard).unack], args)
            pairs = zip(reply[::2], reply[1::2], strict=True)
            extended.update({_text(id_): _text(lease) for id_, lease in pairs})
        return Leased(extended)

    def adopt(self, queue: str, ids: Iterable[str], lease_ms: float) -> list[str]:
        """Put the ids Redis holds nowhere, or only in garbage, in flight with a lease;
        return them. For running jobs Redis lost (or holds as dead: a snapshot restored
        from before a retry): a worker still running one extends the lease (no second
        worker gets it meanwhile); else it is recovered once the lease ends. An id a shard
        of an older count of the queue holds is left there, where its worker extends its
        lease, or, held there in garbage, put in flight there. If the directory that lists
        those shards cannot be read now, or one of them cannot be looked at, nothing is
        adopted (``EngineUnavailable``; the caller tries again): adopting by an older
        listing (or none, in a process that never read it) may put a second copy in
        flight, delivered again when its lease ends. A shard whose master cannot be
        reached does not stop the others: their ids are adopted, then ``PartlyUnavailable``
        is raised with the list of ids adopted as ``done``."""
        lease, adopted, given = _ms(lease_ms, "lease"), [], _ids(ids)
        each = PerShard()
        held: set[str] = set()
        busy_in: dict[Shard, list[str]] = {}  # older shard -> ids in flight or garbage there
        for shard in self._router.others(queue, [], fresh=True):
            waiting, busy = self._withdraw(
                [shard], [i for i in given if i not in held], False, each
            )
            held |= waiting | busy
            busy_in[shard] = [id_ for id_ in given if id_ in busy]
        if each.failure is not None:  # a second copy in flight would be delivered again
            raise each.failure
        # A garbage copy there is taken into flight there, as in the id's own shard: left
        # in garbage, the running job was in flight nowhere (its row running for good if
        # its worker died). One in flight there is left alone by the script.
        places = [(shard, part) for shard, part in busy_in.items() if part]
        places += self._router.route(queue, [id_ for id_ in given if id_ not in held])
        for shard, part in places:
            if not part:
                continue
            k = self._keys(shard)
            keys = [k.pending, k.ready_set, k.unack, k.garbage]
            args: list[str | int] = [lease, *part]
            with each.attempt():  # a master down: the other shards' ids are still adopted
                was_empty, new = self._run("adopt", keys, args)
                adopted += [_text(id_) for id_ in new]
                if was_empty:  # listed, as by add: recover_expired must find the shard
                    try:
                        self._router.directory.register(shard)
                    except EngineUnavailable as exc:  # adopted all the same, as by add
                        each.skip(exc)
        each.check(adopted)
        return adopted

    # An id in flight in a shard of an older count (claimed there, or put there by
    # ``adopt``) is found there by ack, nack and bury too: the worker names the shard it
    # claimed from, reconcile the queue (see ``_at_home``).

    def ack(self, queue: str, ids: Iterable[str]) -> int:
        """Forget finished in-flight ids; return how many were in flight."""

        def run(shard: Shard, part: list[str]) -> int:
            k = self._keys(shard)
            return int(self._run("ack", [k.unack, k.counters, k.priority], part))

        return self._at_home(queue, _ids(ids), run)

    def nack(self, queue: str, items: Mapping[str, float]) -> int:
        """Hand in-flight ids back to pending with retry times; return how many moved.

        Only an id in flight under a lease of this engine's (any that ends in its fraction
        of a ms, see leases.py), or under one no holder set (``adopt``'s: the worker still
        running that job nacks it too, as its extension keeps it), is moved. One in flight
        under another engine's lease is left there and not counted: this engine's lease
        was lost (Redis lost its data, or it ended) and another worker claimed the id since,
        and may run it now; pending, it would be claimed again beside that run. Two holders
        that share a fraction (leases.py) take each other's leases for their own here too.
        """
        dues = _dues(items)

        def run(shard: Shard, part: list[str]) -> int:
            k = self._keys(shard)
            keys = [k.unack, k.pending, k.wake, k.counters]
            args = [self._holder.fraction, *(v for i in part for v in (i, dues[i]))]
            return int(self._run("nack", keys, args))

        return self._at_home(queue, list(dues), run)

    def bury(self, queue: str, ids: Iterable[str]) -> int:
        """Move in-flight ids to garbage; return how many moved."""

        def run(shard: Shard, part: list[str]) -> int:
            k = self._keys(shard)
            return int(self._run("bury", [k.unack, k.garbage, k.counters], part))

        return self._at_home(queue, _ids(ids), run)

    # -- garbage -------------------------------------------------------------------

    def requeue(
        self, queue: str, ids: Iterable[str], due_ms: float = 0, *,
        buried_before: int | None = None,
    ) -> list[str]:  # fmt: skip
        """Move buried ids back to ready (or pending, if ``due_ms`` is later than now);
        return those taken out of garbage. Given ``buried_before`` (ms, by Redis's clock),
        only the ids buried before it are taken out: the reconcile sweep passes the time it
        read the rows, and leaves in garbage the id of a job that died after that."""
        due, given, moved = _due(due_ms), _ids(ids), list[str]()
        before = "" if buried_before is None else str(_ms(buried_before, "buried_before"))

        def run(shard: Shard, part: list[str]) -> int:
            k = self._keys(shard)
            keys = [k.garbage, k.pending, k.ready, k.ready_set, k.wake, k.notify]
            found = [_text(id_) for id_ in self._run("requeue", keys, [due, before, *part])]
            moved.extend(found)
            return len(found)

        try:
            self._at_home(queue, given, run)
        except PartlyUnavailable as exc:
            exc.done = moved  # the ids, as when every shard answers
            raise
        return moved

    def purge(self, queue: str, ids: Iterable[str]) -> int:
        """Delete buried ids; return how many were in garbage."""

        def run(shard: Shard, part: list[str]) -> int:
            k = self._keys(shard)
            return int(self._run("purge", [k.garbage, k.priority], part))

        return self._at_home(queue, _ids(ids), run)

    def _at_home(self, queue: str, ids: list[str], run: Callable[[Shard, list[str]], int]) -> int:
        """Run ``run`` on each id's shard, then on the shards of older counts for the ids
        of a shard that answered without finding them all: an id added or buried before
        the count changed stays where it was until it leaves. A shard that did not answer
        sends nobody looking further: the call reports it (``PartlyUnavailable``, as
        ``add`` says) whatever the other shards hold, and reading the directory that lists
        them would wait for a second timeout when Redis does not answer."""
        done, left, tried = 0, 0, []
        missed: list[str] = []
        each = PerShard()
        for shard, part in self._router.route(queue, ids):
            tried.append(shard)
            with each.attempt():
                found = run(shard, part)
                done += found
                if found < len(part):
                    left, missed = left + len(part) - found, missed + part
        for shard in self._older(queue, tried, each) if missed else []:
            if left <= 0:
                break
            found = each.run(partial(run, shard, missed), 0)
            done, left = done + found, left - found
        done = min(done, len(ids))
        each.check(done)
        return done

    def _older(
        self, queue: str, tried: list[Shard], each: PerShard, *, first: bool = False
    ) -> list[Shard]:
        """The shards of older counts where ids not found in their own may be; none while
        the directory that lists them cannot be read (noted in ``each``: what was done on
        the shards tried is then reported as ``PartlyUnavailable``, not lost).

        ``first`` (read before anything is done) on one Redis: a directory that does not
        answer raises, since the call's own script would wait for the same timeout (a
        ``schedule()`` waited for two); nothing was changed. On a Cluster the directory's
        master may be down while the queue's answers: the last listing serves (``adopt``
        does not guess: it reads the directory anew)."""
        try:
            return self._router.others(queue, tried)
        except EngineUnavailable as exc:
            if first and not self.is_cluster:
                raise
            each.skip(exc)
            return []

    def heartbeat(
        self, queue: str, worker_id: str, ttl_ms: float, info: Mapping[str, Any] | None = None
    ) -> int:
        """Record a live worker for ``ttl_ms`` (0 removes it); return live workers."""
        k = self._keys(Shard(sharding.parse(queue).queue))
        args: list[str | int] = [*_ids([worker_id]), _ms(ttl_ms, "ttl")]
        args.append(json.dumps(dict(info or {})))
        return int(self._run("heartbeat", [k.workers, k.worker_info], args))

    @property
    def owner_key(self) -> str:
        # Beside the queue directory, outside every queue's hash tag.
        return f"{{{self.prefix}}}:deployment"

    def claim_owner(self, owner: str) -> str:
        """Record ``owner`` as the one deployment using this prefix, unless one is recorded
        already; return the recorded one (``owner`` if this call recorded it)."""

        def run() -> Any:
            self.client.set(self.owner_key, owner, nx=True)
            return self.client.get(self.owner_key)

        recorded = self._call(run)
        return owner if recorded is None else _text(recorded)

    def take_turn(self, name: str, ttl_ms: float) -> int:
        """Take the turn ``name`` for ``ttl_ms`` unless another process holds it: one
        process of a deployment does a periodic task (pruning) per interval. Return 0 if
        this call took it, else how many ms until the current holder's turn ends.

        A turn key without an expiry (another program's SET) would be a turn that never
        ends, and the task would never run again: it is given ``ttl_ms`` here, so the turn
        is taken again once that has passed (every process that finds it so sets the same
        expiry, and the first SET NX after it wins, as always)."""
        key = f"{{{self.prefix}}}:turn:{validate_name(name, 'turn name')}"
        ttl = max(1, _ms(ttl_ms, "ttl"))
        if ttl > MAX_DUE_MS:  # Redis refuses an expiry past its clock's range
            raise ValueError(f"ttl must be at most {MAX_DUE_MS} ms, got {brief(ttl_ms)}")

        def run() -> Any:
            pipe = self.client.pipeline(transaction=False)
            pipe.set(key, "1", nx=True, px=ttl)
            pipe.pttl(key)
            return pipe.execute()

        taken, remaining = self._call(run)
        if taken:
            return 0
        if int(remaining) == -1:  # no expiry: repaired (the key may have gone meanwhile)
            self._call(lambda: self.client.pexpire(key, ttl))
        return int(remaining) if int(remaining) > 0 else ttl  # -1/-2: no expiry, or gone

    # -- helpers -------------------------------------------------------------------

    def _wait(self, queues: Sequence[str], kind: str, timeout: float) -> bool:
        """Pop one token from the ``kind`` list of any shard of ``queues`` (see waiting.py).

        Waits at most ``timeout`` seconds, and on one Redis never as long as the client's
        socket timeout (less half a second): a longer BLPOP would fail with a read timeout.
        So this may return False before ``timeout``; callers wait in a loop anyway.
        """
        names = check_names(queues)
        if not names:
            raise ValueError("no queues to wait on")
        for name in names:
            sharding.parse(name)
        seconds = check_timeout(timeout)
        keys = [getattr(self._keys(s), kind) for name in names for s in self._router.targets(name)]
        try:
            return self._call(lambda: self._waiter.wait(keys, seconds))
        except WrongType:
            # One queue's list of another type (another program's) fails the wait on
            # every queue: wait on the others (that queue's scripts report the key).
            usable = self._lists(keys)
            if not usable:
                raise
            return self._call(lambda: self._waiter.wait(usable, seconds))

    def _lists(self, keys: list[str]) -> list[str]:
        """The ``keys`` that hold a list or nothing (one round trip)."""

        def run() -> Any:
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.type(key)
            return pipe.execute()

        found = self._call(run)
        return [
            key for key, kind in zip(keys, found, strict=True) if _text(kind) in ("list", "none")
        ]
