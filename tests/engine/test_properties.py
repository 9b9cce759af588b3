"""Random interleavings of every engine move, checked against a model after each step.

The invariant: every id ever added is in exactly one of pending / ready / in flight /
garbage, read from the keys themselves (ZSCORE / SISMEMBER in one pipeline, plus full
ZRANGE / LRANGE / SMEMBERS), or it is nowhere because it was acked, purged or removed.
"In ready" means in the ``ready_set`` SET; the ready LIST gives the order and may also
hold tombstones (entries of ids removed while ready, which claim pops and skips), so an
id may be listed twice. The model keeps the LIST entry for entry, tombstones included,
and predicts every return value and the exact content of the LIST.

Time is made exact rather than waited for: "past" due times lie days before the server's
clock and "future" ones days after, a lease is either 0 (expired the moment it is taken,
since the deadline equals the server's now) or ten days. So promote and recover_expired
move exactly the ids the model says, whatever the speed of the machine.
"""

from __future__ import annotations

from typing import ClassVar

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from django_delayjobs.engine import Engine

Q = "q"
DAY = 86_400_000
LONG_LEASE = 10 * DAY
IDS = ["a", "b", "c", "d", "e", "f"]

ids_ = st.sampled_from(IDS)
id_lists = st.lists(ids_, min_size=1, max_size=4, unique=True)
# Indexes into the machine's times: 0..3 are past (0 is the epoch), 4..6 are future.
times = st.integers(0, 6)
due_maps = st.dictionaries(ids_, times, min_size=1, max_size=4)
leases = st.sampled_from([0, LONG_LEASE])
batches = st.integers(1, 4)


class EngineMachine(RuleBasedStateMachine):
    redis_url: ClassVar[str] = ""

    def __init__(self) -> None:
        super().__init__()
        self.r = redis.Redis.from_url(self.redis_url)
        self.r.flushdb()
        self.engine = Engine(self.r, prefix="h")
        self.k = self.engine.keys(Q)
        now = self.engine.server_time_ms()
        self.times = [0, now - 3 * DAY, now - 2 * DAY, now - DAY, now + DAY, now + 2 * DAY]
        self.times.append(now + 3 * DAY)
        self.pending: dict[str, int] = {}
        self.entries: list[str] = []  # the ready LIST, tombstones included
        self.ready: set[str] = set()  # ready_set: the ids really in ready
        self.unack: dict[str, bool] = {}  # id -> lease already expired
        self.garbage: set[str] = set()
        self.seen: set[str] = set()
        self.gone: dict[str, str] = {}  # id -> why it is nowhere
        self.counters: dict[str, int] = {}

    def teardown(self) -> None:
        self.r.close()

    # -- model helpers ------------------------------------------------------------------

    def is_past(self, due: int) -> bool:
        return due < self.times[4]

    def held(self, id_: str) -> bool:
        return id_ in self.pending or id_ in self.ready or id_ in self.unack or id_ in self.garbage

    def count(self, event: str, n: int) -> None:
        if n:
            self.counters[event] = self.counters.get(event, 0) + n

    def forget(self, id_: str, why: str) -> None:
        self.gone[id_] = why

    def push_ready(self, id_: str) -> None:
        self.entries.append(id_)
        self.ready.add(id_)

    # -- rules --------------------------------------------------------------------------

    @rule(items=due_maps)
    def add(self, items: dict[str, int]) -> None:
        dues = {id_: self.times[t] for id_, t in items.items()}
        expected = []
        for id_, due in dues.items():
            if id_ in self.ready or id_ in self.unack or id_ in self.garbage:
                continue
            if id_ not in self.pending:
                expected.append(id_)
            if self.is_past(due):
                self.pending.pop(id_, None)
                self.push_ready(id_)
            else:
                self.pending[id_] = due
            self.seen.add(id_)
            self.gone.pop(id_, None)
        assert self.engine.add(Q, dues) == expected
        self.count("added", len(expected))

    @rule(ids=id_lists)
    def remove(self, ids: list[str]) -> None:
        expected = 0
        for id_ in ids:
            if id_ in self.pending:
                del self.pending[id_]
            elif id_ in self.ready:
                self.ready.discard(id_)  # its entry in the LIST becomes a tombstone
            else:
                continue
            expected += 1
            self.forget(id_, "removed")
        assert self.engine.remove(Q, ids) == expected
        self.count("removed", expected)

    @rule(id_=ids_, t=times)
    def reschedule(self, id_: str, t: int) -> None:
        due = self.times[t]
        expected = id_ in self.pending
        if expected:
            if self.is_past(due):
                del self.pending[id_]
                self.push_ready(id_)
            else:
                self.pending[id_] = due
        assert self.engine.reschedule(Q, id_, due) is expected

    @rule(batch=batches)
    def promote(self, batch: int) -> None:
        due = sorted((s, i) for i, s in self.pending.items() if self.is_past(s))[:batch]
        for _, id_ in due:
            del self.pending[id_]
            self.push_ready(id_)
        result = self.engine.promote(Q, batch)
        assert result.moved == len(due)
        assert result.next_due_ms == min(self.pending.values(), default=None)

    @rule(count=batches, lease=leases)
    def claim(self, count: int, lease: int) -> None:
        # Pop entries from the head, never more than the ids still wanted and at most
        # count + 1000 in all; an entry whose id is not in ready is a tombstone.
        expected: list[str] = []
        budget = count + 1000
        while len(expected) < count and budget > 0 and self.entries:
            n = min(count - len(expected), budget)
            popped, self.entries = self.entries[:n], self.entries[n:]
            budget -= len(popped)
            for id_ in popped:
                if id_ in self.ready:
                    self.ready.discard(id_)
                    self.unack[id_] = lease == 0
                    expected.append(id_)
        assert self.engine.claim(Q, count, lease) == expected

    @rule(ids=id_lists, lease=leases)
    def extend_lease(self, ids: list[str], lease: int) -> None:
        expected = [id_ for id_ in ids if id_ in self.unack]
        for id_ in expected:
            self.unack[id_] = lease == 0
        assert self.engine.extend_lease(Q, ids, lease) == expected

    @rule(ids=id_lists)
    def ack(self, ids: list[str]) -> None:
        done = [id_ for id_ in ids if id_ in self.unack]
        for id_ in done:
            del self.unack[id_]
            self.forget(id_, "acked")
        self.count("acked", len(done))
        assert self.engine.ack(Q, ids) == len(done)

    @rule(items=due_maps)
    def nack(self, items: dict[str, int]) -> None:
        dues = {id_: self.times[t] for id_, t in items.items()}
        back = [id_ for id_ in dues if id_ in self.unack]
        for id_ in back:
            del self.unack[id_]
            self.pending[id_] = dues[id_]  # even a past retry time waits for promote
        self.count("nacked", len(back))
        assert self.engine.nack(Q, dues) == len(back)

    @rule(ids=id_lists)
    def bury(self, ids: list[str]) -> None:
        dead = [id_ for id_ in ids if id_ in self.unack]
        for id_ in dead:
            del self.unack[id_]
            self.garbage.add(id_)
        self.count("buried", len(dead))
        assert self.engine.bury(Q, ids) == len(dead)

    @rule(ids=id_lists, t=times)
    def requeue(self, ids: list[str], t: int) -> None:
        due = self.times[t]
        back = [id_ for id_ in ids if id_ in self.garbage]
        for id_ in back:
            self.garbage.discard(id_)
            if self.is_past(due):
                self.push_ready(id_)
            else:
                self.pending[id_] = due
        assert self.engine.requeue(Q, ids, due) == back

    @rule(ids=id_lists)
    def purge(self, ids: list[str]) -> None:
        dead = [id_ for id_ in ids if id_ in self.garbage]
        for id_ in dead:
            self.garbage.discard(id_)
            self.forget(id_, "purged")
        assert self.engine.purge(Q, ids) == len(dead)

    @rule(batch=batches)
    def recover_expired(self, batch: int) -> None:
        # Deadlines are set by the server's clock at claim time: read them to know the
        # order (oldest deadline first, ties by id); which ids expired the model knows.
        deadlines = {m.decode(): s for m, s in self.r.zrange(self.k.unack, 0, -1, withscores=True)}
        expired = sorted((deadlines[i], i) for i, gone in self.unack.items() if gone)
        expected = [id_ for _, id_ in expired[:batch]]
        for id_ in expected:
            del self.unack[id_]
        self.entries = expected + self.entries
        self.ready.update(expected)
        self.count("recovered", len(expected))
        assert self.engine.recover_expired(Q, batch) == expected

    @rule()
    def stats(self) -> None:
        s = self.engine.stats(Q)
        assert s.pending == len(self.pending)
        assert s.overdue == sum(self.is_past(due) for due in self.pending.values())
        assert s.ready == len(self.ready)
        assert s.in_flight == len(self.unack)
        assert s.expired_leases == sum(self.unack.values())
        assert s.garbage == len(self.garbage)
        assert s.next_due_ms == min(self.pending.values(), default=None)
        assert s.counters == self.counters

    # -- the invariant ------------------------------------------------------------------

    @invariant()
    def every_id_is_in_exactly_one_place(self) -> None:
        k, r = self.k, self.r
        pipe = r.pipeline(transaction=True)
        pipe.time()
        pipe.zrange(k.pending, 0, -1, withscores=True)
        pipe.lrange(k.ready, 0, -1)
        pipe.smembers(k.ready_set)
        pipe.zrange(k.unack, 0, -1, withscores=True)
        pipe.zrange(k.garbage, 0, -1)
        for id_ in IDS:
            pipe.zscore(k.pending, id_)
            pipe.sismember(k.ready_set, id_)
            pipe.zscore(k.unack, id_)
            pipe.zscore(k.garbage, id_)
        (sec, usec), pending, listed, members, unack, garbage, *places = pipe.execute()
        now = int(sec) * 1000 + int(usec) // 1000

        entries = [m.decode() for m in listed]
        assert entries == self.entries
        ready = {m.decode() for m in members}
        assert ready == self.ready
        assert ready <= set(entries), f"in ready_set without an entry: {ready - set(entries)}"
        assert {m.decode(): int(s) for m, s in pending} == self.pending
        leases = {m.decode(): s for m, s in unack}
        assert set(leases) == set(self.unack)
        for id_, expired in self.unack.items():
            # A lease ends in the ms of its deadline, whatever its fraction of a ms.
            assert (int(leases[id_]) <= now) is expired, (id_, leases[id_], now)
        assert {m.decode() for m in garbage} == self.garbage

        for n, id_ in enumerate(IDS):
            in_pending, in_ready, in_unack, in_garbage = places[4 * n : 4 * n + 4]
            where = [in_pending is not None, bool(in_ready), in_unack is not None]
            where.append(in_garbage is not None)
            if id_ in self.seen and id_ not in self.gone:
                assert sum(where) == 1, f"{id_} is in {sum(where)} places: {where}"
            else:
                assert not any(where), f"{id_} ({self.gone.get(id_, 'never added')}) is held"
            assert self.held(id_) == any(where)

        allowed = {*(key.encode() for key in k), self.engine.queues_key.encode()}
        assert set(r.keys("*")) <= allowed


@pytest.mark.timeout(600)
def test_random_interleavings_keep_every_id_in_exactly_one_place(redis_url: str) -> None:
    EngineMachine.redis_url = redis_url
    run_state_machine_as_test(
        EngineMachine,
        settings=settings(
            max_examples=100,
            stateful_step_count=40,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
