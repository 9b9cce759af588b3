"""The queue page's charts in headless Chromium, light and dark, with screenshots.

Set ``DELAYJOBS_SCREENSHOTS=docs/img`` to refresh ``docs/img/admin-charts-{light,dark}.png``.

The scene: a real worker run (in-process ``--burst``) of jobs that succeed, are retried
and die, on two queues, during the current minute; and, so that the picture shows what
hours of traffic look like, the 170 minutes before it recorded through the same recorder
with backdated times (a steady load with a backlog episode, when lateness climbs to
seconds). The page itself is the real one, read from Redis.
"""

from __future__ import annotations

import datetime
import math
import os
import random
import re
import shutil
from pathlib import Path

import pytest
from django.urls import reverse

from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.metrics import store
from django_delayjobs.metrics.recorder import RECORDER, Recorder
from django_delayjobs.models import Job, Status
from django_delayjobs.outcomes import Outcome, Result
from tests.test_admin_browser import _background, browser, burst, log_in, superuser
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
__all__ = ["browser", "superuser"]  # fixtures, imported for this module's tests

MINUTES = 170


@pytest.fixture(autouse=True)
def _clean(redis_client, settings, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # see test_admin_browser.py
    RECORDER.take()
    RECORDER.snapped.clear()
    settings.DELAYJOBS = {**settings.DELAYJOBS, "RETRY_BACKOFF_SECONDS": 0}


def _attempt(outcome: Outcome, at: datetime.datetime, late: float, run: float, failed=False):
    job = Job(run_at=at - datetime.timedelta(seconds=late), started_at=at, attempts=1)
    return Result(outcome, job, failed=failed, duration=run)


def seed_history(queue: str, rng: random.Random) -> None:
    """Record ``MINUTES`` minutes of traffic before the current one, and the engine
    counter snapshots that give scheduled and cancelled jobs per minute."""
    engine = get_engine()
    now = engine.server_time_ms() / 1000
    first = int(now // 60) - MINUTES
    recorder = Recorder()
    added = removed = 0
    for i in range(MINUTES):
        minute = first + i
        at = datetime.datetime.fromtimestamp(minute * 60 + 30, tz=datetime.UTC)
        backlog = 60 <= i <= 72
        load = int(26 + 14 * math.sin(i / 17) + rng.randint(0, 6))
        for _ in range(load):
            late = rng.uniform(0.5, 4.0) if backlog else rng.lognormvariate(math.log(0.004), 0.6)
            result = _attempt(Outcome.SUCCEEDED, at, late, rng.uniform(0.005, 0.06))
            recorder.record(queue, result, now=minute * 60 + 30)
        failures = rng.choice([0, 0, 0, 1, 2])
        for n in range(failures):
            outcome = Outcome.DEAD if n == 1 else Outcome.RETRYING
            recorder.record(queue, _attempt(outcome, at, 0.004, 0.02, failed=True),
                            now=minute * 60 + 30)  # fmt: skip
        if rng.random() < 0.15:
            recorder.record(queue, Result(Outcome.SKIPPED, None), now=minute * 60 + 30)
        key = store.minute_key(engine, queue, minute)
        engine.client.hset(key, mapping={"snap:added": added, "snap:removed": removed})
        cancelled = rng.randint(0, 6)
        added += load + cancelled + rng.randint(-3, 3)
        removed += cancelled
    recorder.flush(engine, [], now=now)
    counters = engine.keys(queue).counters
    engine.client.hset(counters, mapping={"added": added, "removed": removed})


def run_jobs(queue: str, ok: int, failing: int) -> None:
    RECORDER.flush(get_engine(), [queue])  # a running worker's first flush of the minute
    for n in range(ok):
        schedule(tasks.record, in_=0, args=[f"{queue}-{n}"], queue=queue)
    for n in range(failing):
        schedule(tasks.fail, in_=0, args=[f"{queue}-bad-{n}"], max_attempts=2, queue=queue)
    assert schedule(tasks.record, in_=600, args=["never"], queue=queue).cancel()
    burst(queue)
    assert Job.objects.filter(queue=queue, status=Status.DEAD).count() == failing


def _fill(page, selector: str) -> tuple[int, ...]:
    color = page.eval_on_selector(selector, "e => getComputedStyle(e).fill")
    return tuple(int(c) for c in re.findall(r"\d+", color)[:3])


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_charts_in_chromium_light_and_dark(browser, live_server, superuser, scheme, tmp_path):
    rng = random.Random(16)
    seed_history("orders", rng)
    seed_history("mail", rng)
    run_jobs("orders", ok=12, failing=2)
    run_jobs("mail", ok=5, failing=1)

    context = browser.new_context(color_scheme=scheme, viewport={"width": 1440, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    queues = reverse("admin:django_delayjobs_queues")
    log_in(page, live_server.url, queues)
    page.click("#toggle-nav-sidebar")

    charts = page.locator("#delayjobs-charts")
    assert charts.is_visible()
    assert page.locator("#delayjobs-charts h2").inner_text().lower() == "the last 3 hours"
    svg = page.locator("#delayjobs-throughput svg")
    assert svg.get_attribute("role") == "img"
    assert page.locator("#delayjobs-throughput-desc").count() == 1
    assert page.locator("#delayjobs-throughput rect.delayjobs-s-succeeded").count() > MINUTES / 2
    assert page.locator("#delayjobs-throughput rect.delayjobs-s-dead").count() >= 1
    assert page.locator("#delayjobs-lateness polyline.delayjobs-s-p99").count() >= 1

    # Colours follow the theme: dark fills on light, light fills on dark; labels readable.
    dark = scheme == "dark"
    bar = _fill(page, "#delayjobs-throughput rect.delayjobs-s-succeeded")
    label = _fill(page, "#delayjobs-throughput text")
    page_bg = _background(page, "body")
    assert (sum(bar) > 350) == dark, bar
    assert (sum(label) > 400) == dark, label
    assert abs(sum(label) - sum(page_bg)) > 250, (label, page_bg)

    # The table behind the chart: hidden until opened, then the numbers are there.
    summary = page.locator("#delayjobs-throughput details summary")
    table = page.locator("#delayjobs-throughput details table")
    assert not table.is_visible()
    summary.click()
    assert table.is_visible()
    last = table.locator("tbody tr").last.locator("td")
    assert int(last.nth(0).inner_text()) >= 1  # this run's successes, in the latest minute

    page.locator("#delayjobs-throughput details").evaluate("e => e.open = false")
    box = charts.bounding_box()
    shot = tmp_path / f"charts-{scheme}.png"
    page.screenshot(path=shot, clip={"x": 0, "y": 0, "width": 1440,
                                     "height": box["y"] + box["height"] + 12})  # fmt: skip
    context.close()
    assert shot.stat().st_size > 20_000
    target = os.environ.get("DELAYJOBS_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(target) / f"admin-charts-{scheme}.png")
