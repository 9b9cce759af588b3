"""Audit of the engine: each test is a failing reproduction of one bug (see its docstring
for what is wrong and what is right). Runs on the session's private Redis."""

from __future__ import annotations

import time

import pytest

from django_delayjobs.engine import Engine
from django_delayjobs.engine.validation import MAX_DUE_MS


def test_promote_reports_a_positive_wait_for_a_far_future_due_time(engine: Engine):
    """``add`` accepts any finite, non-negative due time, but ``promote.lua`` returns the
    wait until the next due time as a Lua number that Redis converts to a 64-bit integer:
    for a due time more than 2^63 us (about 292,000 years) away the conversion overflows
    (promote.lua:30-31) and ``PromoteResult.next_due_in_us`` is -9223372036854775808.
    The promoter then sleeps ``min(tick, negative)``, i.e. not at all, and spins on
    ``promote`` at full speed; ``--burst`` never ends (``burst_done`` waits a negative time
    and loops). Right: a wait that is never negative (clamp it to what fits, or refuse due
    times that far away in ``check_due``)."""
    with pytest.raises(ValueError, match="year 9999"):
        engine.add("q", {"far": 1e16})  # year ~318,000
    with pytest.raises(ValueError, match="year 9999"):
        engine.nack("q", {"far": MAX_DUE_MS + 1})
    engine.add("q", {"last": MAX_DUE_MS})  # the latest due time accepted
    result = engine.promote("q")
    assert result.next_due_ms == MAX_DUE_MS
    assert result.next_due_in_us is not None and result.next_due_in_us > 0


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda e: e.add("q", {"a": 10**400}), id="add-due"),
        pytest.param(lambda e: e.claim("q", 1, lease_ms=10**400), id="claim-lease"),
        pytest.param(lambda e: e.wait_for_work(["q"], 10**400), id="wait-timeout"),
    ],
)
def test_a_huge_int_time_is_refused_with_a_value_error(engine: Engine, call):
    """The engine refuses bad times with ``TypeError``/``ValueError`` (the contract its
    tests check: nan, inf, negative...), but an int too large for a float makes
    ``math.isfinite`` raise ``OverflowError`` (validation.py:47, waiting.py:41), an
    exception no caller expects. Right: ``ValueError`` ("must be a finite, non-negative
    number"), as for ``math.inf``."""
    with pytest.raises(ValueError, match="finite"):
        call(engine)


def test_re_adding_a_pending_id_with_priority_0_forgets_its_old_priority(engine: Engine):
    """``add`` gives an id already pending "the new due time" and takes "0 for ids left
    out" of ``priorities``, but add.lua:24 only writes a priority that is not 0 and never
    deletes one: an id added with priority 100 and re-added with priority 0 keeps 100 in
    the ``priority`` hash (documented to hold "only ids whose priority is not 0") and is
    promoted ahead of an id of priority 50 due at the same time. Right: a re-add sets
    the priority it is given (HDEL when it is 0)."""
    due = engine.server_time_ms() + 200
    engine.add("q", {"a": due + 3_600_000}, {"a": 100})
    engine.add("q", {"a": due})  # the same id, now of priority 0 (and due sooner)
    engine.add("q", {"b": due}, {"b": 50})
    deadline = time.monotonic() + 5
    while engine.promote("q").moved < 2:  # both are due at the same time
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert engine.claim("q", 2) == ["b", "a"]


def test_an_old_shard_holding_only_tombstones_is_listed_again_when_an_id_arrives(redis_client):
    """``forget_empty_shards`` drops an old-count shard whose counts are all 0, reading
    ready as ``SCARD ready_set`` (reader.py:103-105), and relies on "its add finds the shard
    empty and lists it again" if an old process adds to it later. But add.lua:12 decides
    "empty" with ``EXISTS`` on the ready LIST, which still holds the tombstones of ids
    removed while ready. So an id added by an old process to such a shard is not listed
    again: the current engine's workers and promoters never serve that shard, and the
    job waits until reconcile copies it to its new shard (leaving the old copy behind for
    good), though the docstring promises "a shard that holds ids is never left unlisted".
    Right: one notion of empty in both places (count the ready LIST, or let add test
    ``ready_set``)."""
    old = Engine(redis_client, prefix="t")  # a process of the old count: "q" has 1 shard
    old.add("q", {"a": 0})
    assert old.remove("q", ["a"]) == 1  # removed while ready: a tombstone stays in ready
    new = Engine(redis_client, prefix="t", shards={"q": 3})
    assert new.forget_empty_shards("q") == ["q#0/1"]
    old.add("q", {"b": 0})  # an old process adds to the shard it knows
    assert old.stats("q").ready == 1
    listed = {m.decode() for m in redis_client.smembers(new.queues_key)}
    assert "q" in listed, f"the shard holding b is not in the directory: {sorted(listed)}"
