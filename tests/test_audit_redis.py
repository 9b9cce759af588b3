"""Audit of the engine facing a Redis in hostile or unusual states (moved once fixed)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from django_delayjobs.connection import get_engine
from django_delayjobs.engine import Engine
from django_delayjobs.engine.validation import MAX_DUE_MS
from django_delayjobs.promoter import Promoter

from .test_rest_helpers import client_for, make_user, url

QUEUES = "admin:django_delayjobs_queues"
#: Scores no engine call writes (add refuses them), yet a ZSET may hold: another program,
#: an older version, a hand-typed ZADD.
ALIEN_SCORES = ["inf", "1e20", "1e300", "-inf", "-5"]


@pytest.mark.parametrize("score", ALIEN_SCORES)
def test_scores_the_engine_never_writes_do_not_break_promote_or_the_readers(redis_client, score):
    """A pending score of +inf made promote, stats and next_due raise OverflowError (the
    promoter thread died, and with it the worker, at every restart); a finite one past
    ``MAX_DUE_MS`` overflowed the wait in us (negative: the promoter spun)."""
    engine = Engine(redis_client, prefix="t")
    k = engine.keys("q")
    redis_client.zadd(k.pending, {"alien": score})
    redis_client.zadd(k.unack, {"held": score})
    redis_client.zadd(k.garbage, {"dead": score})
    redis_client.zadd(k.workers, {"w": score})
    result = engine.promote("q")
    if result.next_due_in_us is not None:
        assert 0 <= result.next_due_in_us
        assert 0 <= result.next_due_ms <= MAX_DUE_MS
    stats = engine.stats("q")
    for value in (stats.next_due_ms, stats.oldest_lease_ms):
        assert value is None or 0 <= value <= MAX_DUE_MS
    assert all(0 <= due <= MAX_DUE_MS for _, due in engine.next_due("q"))
    assert all(0 <= died <= MAX_DUE_MS for _, died in engine.garbage("q"))
    assert all(0 <= w["expires_ms"] <= MAX_DUE_MS for w in engine.workers("q"))


@pytest.mark.parametrize("score", ["inf", "1e20"])
def test_the_promoter_sleeps_a_tick_at_most_and_never_a_negative_time(redis_client, score):
    engine = get_engine()
    redis_client.zadd(engine.keys("default").pending, {"alien": score})
    wait = Promoter(engine, ["default"], tick=1.0).step()
    assert 0 < wait <= 1.0


@pytest.mark.parametrize("score", ["inf", "1e20", MAX_DUE_MS])
def test_the_pages_that_show_queues_answer_with_a_score_past_year_9999(
    client, redis_client, settings, score, db
):
    """``MAX_DUE_MS`` is accepted by add (a row due at datetime.max is re-added there),
    yet shown as a datetime it is year 10000: the queue page and queues/ answered 500."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "METRICS_TOKEN": "t" * 32}
    user = make_user("root", superuser=True)
    client.force_login(user)
    engine = get_engine()
    k = engine.keys("default")
    for key in (k.pending, k.unack, k.garbage, k.workers):
        redis_client.zadd(key, {"00000000-0000-4000-8000-000000000001": score})
    engine.add("default", {"00000000-0000-4000-8000-000000000002": 1.0})  # listed
    pages = {
        "admin queues": client.get(reverse(QUEUES)),
        "api queues": client_for(user).get(url("queues")),
        "health": client.get(reverse("delayjobs_health")),
        "metrics": client.get(
            reverse("delayjobs_metrics"), HTTP_AUTHORIZATION="Bearer " + "t" * 32
        ),  # fmt: skip
    }
    for page, response in pages.items():
        assert response.status_code in (200, 503), (page, response.content[:300])
    assert pages["admin queues"].context["redis_error"] == ""
    assert pages["health"].status_code == 503  # no live worker; every check still ran
