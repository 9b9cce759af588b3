"""A claim sent again with its token (its reply was lost) returns what it took.

Each test runs on one Redis, and with ``-m cluster`` on the session's Redis Cluster, with
``Q`` a queue of 1 shard and with ``Q`` one shard of a queue of 6 (as test_operations.py).
"""

from __future__ import annotations

import enum
from typing import Any

import pytest

from django_delayjobs.engine import Engine, WrongType
from django_delayjobs.engine.claims import Claimer, ClaimToken, record_ms

from .test_operations import HOUR, wait_until

Q = "q"


def in_flight(r: Any, engine: Engine) -> dict[str, int]:
    return {m.decode(): int(s) for m, s in r.zrange(engine.keys(Q).unack, 0, -1, withscores=True)}


def ready(r: Any, engine: Engine) -> set[str]:
    return {m.decode() for m in r.smembers(engine.keys(Q).ready_set)}


def test_a_claim_sent_again_returns_what_it_took_and_takes_nothing_new(engine, backend_client):
    engine.add(Q, dict.fromkeys(["a", "b", "c", "d", "e"], 0))
    token = ClaimToken("w1", 0)
    assert engine.claim(Q, 2, HOUR, token) == ["a", "b"]
    leases = in_flight(backend_client, engine)
    assert engine.claim(Q, 2, HOUR, token) == ["a", "b"]  # its reply was lost: the same
    assert engine.claim(Q, 5, HOUR, token) == ["a", "b"]  # whatever the count
    assert in_flight(backend_client, engine) == leases  # the same leases, nothing new
    assert ready(backend_client, engine) == {"c", "d", "e"}
    assert engine.claim(Q, 2, HOUR, ClaimToken("w1", 1)) == ["c", "d"]  # the next call
    assert engine.claim(Q, 2, HOUR, ClaimToken("w2", 0)) == ["e"]  # another claimer's own
    assert engine.claim(Q, 2, HOUR, ClaimToken("w1", 1)) == ["c", "d"]  # each its record
    assert engine.claim(Q, 2, HOUR, token) == []  # w1's record is its last claim's


def test_ids_that_left_flight_since_are_not_returned_again(engine, backend_client):
    engine.add(Q, dict.fromkeys(["a", "b", "c"], 0))
    token = ClaimToken("w", 7)
    assert engine.claim(Q, 3, HOUR, token) == ["a", "b", "c"]
    assert engine.ack(Q, ["a"]) == 1
    # b back in ready, then claimed by another worker (a lease of its own)
    assert engine.nack(Q, {"b": 0}) == 1
    engine.promote(Q)
    assert engine.claim(Q, 1, 2 * HOUR) == ["b"]
    assert engine.claim(Q, 3, HOUR, token) == ["c"]


def test_a_record_lasts_two_thirds_of_the_lease_then_the_token_claims_anew(engine, backend_client):
    engine.add(Q, {"a": 0})
    token = ClaimToken("w", 0)
    assert engine.claim(Q, 1, 60, token) == ["a"]
    record = engine.keys(Q).claims("w")
    assert 0 < backend_client.pttl(record) <= record_ms(60) == 40
    wait_until(lambda: not backend_client.exists(record))  # gone before the lease ends
    assert engine.claim(Q, 1, HOUR, token) == []  # a new claim: ready is empty
    assert wait_until(lambda: engine.recover_expired(Q)) == ["a"]  # the lease's, as before
    assert engine.claim(Q, 1, HOUR, token) == ["a"]


def test_a_claim_that_takes_nothing_writes_nothing(engine, backend_client):
    assert engine.claim(Q, 10, HOUR, ClaimToken("idle", 0)) == []
    assert backend_client.dbsize() == 0


def test_a_record_of_another_type_fails_the_claim_before_it_takes_anything(engine, backend_client):
    engine.add(Q, {"a": 0})
    backend_client.rpush(engine.keys(Q).claims("w"), "x")  # another program's
    with pytest.raises(WrongType, match=":claim:w"):
        engine.claim(Q, 1, HOUR, ClaimToken("w", 0))
    assert ready(backend_client, engine) == {"a"}


def test_a_claimer_keeps_a_shard_s_token_until_a_claim_from_it_is_answered():
    claimer = Claimer()
    first = claimer.token("q")
    assert claimer.token("q") == first  # not answered: the same call
    assert claimer.token("r") != first  # another shard: its own
    claimer.answered("q")
    assert claimer.token("q") not in (first, claimer.token("r"))


class Call(enum.IntEnum):
    ONE = 1  # an int whose repr is not its digits: redis-py would send "<Call.ONE: 1>"


class Unchecked(ClaimToken):
    def __post_init__(self) -> None:
        pass


@pytest.mark.parametrize(
    ("claimer", "call", "error"),
    [("a:b", 0, ValueError), ("", 0, ValueError), ("x" * 65, 0, ValueError),
     (True, 0, TypeError), (7, 0, TypeError), (b"w", 0, TypeError),
     ("w", True, TypeError), ("w", "1", TypeError), ("w", 1.0, TypeError),
     ("w", Call.ONE, TypeError), ("w", None, TypeError),
     ("w", -1, ValueError), ("w", 2**63, ValueError),
     pytest.param("w", 10**5000, ValueError, id="w-10**5000-ValueError")],
)  # fmt: skip
def test_a_token_with_a_bad_field_is_refused_when_made(claimer, call, error):
    with pytest.raises(error, match=r"^(claimer|call) ") as refused:
        ClaimToken(claimer, call)
    assert len(str(refused.value)) < 200  # says what was wrong, not a 5000-digit number
    assert ClaimToken("w", 2**63 - 1).call == 2**63 - 1  # the largest call there is


@pytest.mark.parametrize(
    "token", [("w", 0), {"claimer": "w", "call": 0}, "w", 0, Unchecked("w", Call.ONE)]
)
def test_a_claim_with_anything_but_a_token_is_refused_before_redis(engine, backend_client, token):
    engine.add(Q, {"a": 0})
    with pytest.raises(TypeError, match="token must be a ClaimToken"):
        engine.claim(Q, 1, HOUR, token)
    assert ready(backend_client, engine) == {"a"}
