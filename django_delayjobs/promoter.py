"""The promoter: moves due ids to ready exactly when they are due and recovers expired
leases. Any number may run at once (every move is one Lua script), so there is no leader
to elect. (The reconcile sweep runs beside it, in a thread of its own: see worker.py.)
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial

from .conf import delayjobs_settings
from .engine import Engine, EngineUnavailable, PerShard, WrongType
from .engine.errors import unreachable
from .engine.sharding import alone
from .engine.waiting import MIN_BLOCK

logger = logging.getLogger("django_delayjobs.promoter")

#: Redis checks blocking timeouts about every 100 ms (hz 10), so the promoter blocks in
#: Redis (where an earlier job can wake it) only until this long before the next due
#: time, and sleeps the rest itself.
PRECISE_STRETCH = 0.11
RECOVER_EVERY = 1.0
#: How often a promoter lists its queues' shards in the directory again (see
#: ``Engine.list_shards``): a queue the directory lost is back in the metrics this soon.
LIST_EVERY = 60.0


#: How often a key of the wrong type that is still there is logged again (seconds).
BROKEN_REMINDER_SECONDS = 600.0


class BrokenKeys:
    """The shards that a key of the wrong type stops (``WrongType``: another program wrote
    the key). Such a shard is no outage: Redis answers and every other shard is served at
    full speed, so it is passed over (tried again at each pass, so that it is served as
    soon as the key is fixed) and logged once by the key it names, then every
    ``BROKEN_REMINDER_SECONDS`` while it lasts. Shared by the threads of a process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._logged: dict[str, float] = {}  # message -> when it was logged

    def report(self, shard: str, exc: WrongType) -> None:
        now, message = time.monotonic(), str(exc)
        with self._lock:
            last = self._logged.get(message)
            if last is not None and now - last < BROKEN_REMINDER_SECONDS:
                return
            self._logged[message] = now
        logger.error("queue %s is not served: %s", shard, exc)

    @contextlib.contextmanager
    def watch(self, shard: str) -> Iterator[None]:
        """Pass over ``shard`` (and report it) if a key of it has the wrong type."""
        try:
            yield
        except WrongType as exc:
            self.report(shard, exc)


#: How long the promoter passes over the shards of a Cluster master that did not answer.
SKIP_SECONDS = 5.0


class Breaker:
    """Pass over, for ``SKIP_SECONDS``, the shards of a Cluster master that just failed to
    answer (a circuit breaker): a frozen or cut-off master costs each call the client's
    timeout and its retry, about 2 s, so a pass over its shards took seconds while the
    healthy masters' shards waited. A shard passed over counts as failed (the caller logs
    the outage as before); after a failover its slots have a new master, which is tried at
    once. On one Redis nothing is passed over: there is no other master to serve."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._open: dict[str, tuple[float, EngineUnavailable]] = {}  # master -> until, why

    @contextlib.contextmanager
    def guard(self, shard: str) -> Iterator[Callable[[EngineUnavailable], None]]:
        """Raise at once while ``shard``'s master is passed over; else run the block, and
        pass that master over if the block raises that it did not answer, or gives that
        error to the function it is handed (a call that returned a failure with its
        results: ``Leased.failure``). The master is the one the client named before the
        call (a failover may have named a new one since)."""
        failed: list[EngineUnavailable] = []
        if not self.engine.is_cluster:
            yield failed.append
            return
        try:
            master = self.engine.node_of(shard)  # the client's slot table: no round trip
        except EngineUnavailable:
            master = ""
        until, why = self._open.get(master, (0.0, None))
        if why is not None and time.monotonic() < until:  # a new error: tracebacks add up
            raise EngineUnavailable(
                f"{why} (passed over for {SKIP_SECONDS:g} s)"
            ) from why.__cause__
        try:
            yield failed.append
        except EngineUnavailable as exc:
            self._trip(master, [exc])
            raise
        if not self._trip(master, failed):
            self._open.pop(master, None)

    def _trip(self, master: str, failures: list[EngineUnavailable]) -> bool:
        """Pass ``master`` over if one of ``failures`` says it did not answer."""
        for exc in failures:
            if unreachable(exc):
                self._open[master] = (time.monotonic() + SKIP_SECONDS, exc)
                return True
        return False


class Promoter:
    def __init__(
        self,
        engine: Engine,
        queues: Sequence[str],
        *,
        tick: float | None = None,
        stop: threading.Event | None = None,
        broken: BrokenKeys | None = None,
    ) -> None:
        self.engine = engine
        self.queues = list(queues)
        self.tick = tick or delayjobs_settings.TICK_SECONDS
        self.batch = delayjobs_settings.BATCH_SIZE
        self.stop = stop or threading.Event()
        self.broken = broken or BrokenKeys()
        self.breaker = Breaker(engine)
        self._last_recover = 0.0
        self._last_list: float | None = None

    def new_pass(self) -> PerShard:
        """What a pass notes its failures in: on one Redis, the first call it does not
        answer ends the pass (``each.until_down``): every call after would wait for the
        same timeout, and a pass over three queues waited for six."""
        return PerShard(one_server=not self.engine.is_cluster)

    def shards(self, each: PerShard) -> list[str]:
        """Every shard of every queue (a queue of 1 shard is its own); the queues whose
        shards cannot be listed (one Redis that does not answer) are noted in ``each``."""
        found: list[str] = []
        for queue in each.until_down(self.queues):
            with each.attempt():
                found += self.engine.shards(queue)
        return found

    def promote_due(self) -> tuple[int, float | None]:
        """Promote everything due now; return (ids moved, seconds until the next due id
        over every shard, or None when nothing is pending). A shard that cannot be reached
        is passed over: ``PartlyUnavailable`` (with that pair) once the others are done."""
        each = self.new_pass()
        found = self._promote(each)
        each.check(found)
        return found

    def _promote(self, each: PerShard) -> tuple[int, float | None]:
        """One batch from each shard per round, then more rounds for the shards that moved
        a whole batch or whose next id fell due meanwhile: a backlog in one shard (a
        million ids due at midnight take seconds) must hold back no other's due ids.

        The time until the next due id is returned as from the end of the pass: each
        shard's is measured when it is promoted, and a pass may last long after that."""
        moved = 0
        next_at: dict[str, float] = {}  # shard -> when its next id is due (monotonic)
        every = turn = self.shards(each)
        while turn:
            full = set()
            for shard in each.until_down(turn):
                next_at.pop(shard, None)
                with each.attempt(), self.breaker.guard(shard), self.broken.watch(shard):
                    sent = time.monotonic()  # Redis measured the wait after this
                    result = self.engine.promote(alone(shard), self.batch)
                    moved += result.moved
                    if result.moved >= self.batch:  # more may be due: its next turn
                        full.add(shard)
                    elif result.next_due_in_us is not None:
                        next_at[shard] = sent + result.next_due_in_us / 1e6
            if not full:
                break
            now = time.monotonic()
            turn = [s for s in every if s in full or next_at.get(s, now + 1) <= now]
        if not next_at:
            return moved, None
        return moved, max(0.0, min(next_at.values()) - time.monotonic())

    def housekeeping(self, now: float, each: PerShard) -> None:
        """Recover expired leases and forget emptied shards of older counts (each second),
        list the current shards again (each minute), passing over the shards that cannot be
        reached (noted in ``each``)."""
        if now - self._last_recover >= RECOVER_EVERY:
            self._last_recover = now
            for shard in each.until_down(self.shards(each)):
                with each.attempt(), self.breaker.guard(shard), self.broken.watch(shard):
                    while len(self.engine.recover_expired(alone(shard), self.batch)) == self.batch:
                        pass
            if self._last_list is None or now - self._last_list >= LIST_EVERY:
                self._last_list = now
                for queue in each.until_down(self.queues):
                    with each.attempt():
                        self.engine.list_shards(queue)
            for queue in each.until_down(self.queues):
                forget = partial(self.engine.forget_empty_shards, queue, self.breaker.guard)
                # with those forgotten beside a shard passed over (``PartlyUnavailable.done``)
                forgotten: list[str] = each.run(forget, [])
                for shard in forgotten:
                    logger.info("queue %s: shard %s of an older shard count is empty; "
                                "no longer served", queue, shard)  # fmt: skip

    def step(self) -> float:
        """One pass; return how long to sleep before the next.

        A shard whose master cannot be reached (a Cluster failing over) does not stop the
        pass: the others are served, then ``PartlyUnavailable`` is raised with the time to
        sleep as ``done``, so that the caller keeps their pace while it logs the outage.
        """
        each = self.new_pass()
        self.housekeeping(time.monotonic(), each)
        next_due = self._promote(each)[1]
        wait = self.tick if next_due is None else min(self.tick, next_due)
        each.check(wait)
        return wait

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, waking early if an earlier job is scheduled meanwhile."""
        deadline = time.monotonic() + seconds
        # A wait on the wake list may end early without a token (it never outlasts the
        # client's socket timeout), so wait again until the last precise stretch: a wake
        # token must be able to end the sleep at any moment until then.
        while not self.stop.is_set():
            blocking = deadline - time.monotonic() - PRECISE_STRETCH
            if blocking < MIN_BLOCK:  # a shorter pop would still block that long
                break
            if self.engine.wait_for_wake(self.queues, blocking):
                return
        remaining = deadline - time.monotonic()
        if remaining > 0:
            self.stop.wait(remaining)
