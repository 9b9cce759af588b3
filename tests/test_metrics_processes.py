"""The metrics of a whole deployment, after two real worker processes ran known jobs.

Scraped over real HTTP, from the ``metrics/`` view (a live server) and from a worker's
``--metrics-port``, and parsed with ``prometheus_client``'s own parser.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from datetime import timedelta

import pytest
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from django_delayjobs import schedule
from django_delayjobs.metrics import layout
from django_delayjobs.models import Job, Status
from tests.helpers import start_worker, stop, wait_for
from tests.testapp import tasks

#: What the known jobs below count to, outcome by outcome.
EXPECTED = {"scheduled": 44, "succeeded": 34, "failed": 6, "retried": 3, "dead": 3,
            "skipped": 2, "cancelled": 5}  # fmt: skip

parser = pytest.importorskip("prometheus_client.parser")

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TOKEN = "metrics-test-token-0123456789"
#: Named in METRICS_ACTIONS (``record`` is not): series of their own.
ACTIONS = [tasks.slow.delayable_name, tasks.fail.delayable_name]


@pytest.fixture(autouse=True)
def _token(settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "METRICS_TOKEN": TOKEN, "METRICS_ACTIONS": ACTIONS}


def scrape(url: str, token: str | None = TOKEN) -> dict[str, dict[tuple, float]]:
    """GET ``url`` and parse it: sample name -> {sorted label items: value}."""
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    samples: dict[str, dict[tuple, float]] = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def jobs_total(samples, outcome: str, queue: str = "default") -> float:
    return samples["delayjobs_jobs_total"][(("outcome", outcome), ("queue", queue))]


def bucket(samples, name: str, le: str, queue: str = "default") -> float:
    return samples[f"{name}_bucket"][(("le", le), ("queue", queue))]


def status_code(url: str, token: str | None) -> int:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def schedule_known_jobs() -> None:
    """34 succeed (4 of them 40 s overdue), 3 fail twice then die, 2 are skipped, 5 are
    cancelled: 44 scheduled."""
    now = timezone.now()
    soon = now + timedelta(seconds=1.5)
    for n in range(30):
        schedule(tasks.slow, at=soon, args=[f"ok{n}", 0.05])
    for n in range(4):
        schedule(tasks.record, at=now - timedelta(seconds=40), args=[f"late{n}"])
    for n in range(3):
        schedule(tasks.fail, at=soon, args=[f"bad{n}"], max_attempts=2)
    for n in range(2):  # expired before the commit hands it to Redis (schedule() refuses
        with transaction.atomic():  # a job that has expired already)
            job = schedule(tasks.record, at=now - timedelta(seconds=40), args=[f"expired{n}"],
                           expires=timedelta(hours=1))  # fmt: skip
            Job.objects.filter(pk=job.pk).update(expires_at=now - timedelta(seconds=39))
    for n in range(5):
        assert schedule(tasks.record, in_=3600, args=[f"cancel{n}"]).cancel()


def all_finished() -> bool:
    return not Job.objects.exclude(
        status__in=[Status.SUCCEEDED, Status.DEAD, Status.SKIPPED, Status.CANCELLED]
    ).exists()


def test_one_scrape_counts_what_two_worker_processes_did(redis_url, live_server, tmp_path):
    env = {"DELAYJOBS_RETRY_BACKOFF_SECONDS": "0", "DELAYJOBS_METRICS_TOKEN": TOKEN,
           "DELAYJOBS_METRICS_ACTIONS": json.dumps(ACTIONS)}  # fmt: skip
    log = tmp_path / "a.log"
    workers = [
        start_worker(redis_url, "--concurrency", "2", "--metrics-port", "0", env=env, log=log),
        start_worker(redis_url, "--concurrency", "2", env=env, log=tmp_path / "b.log"),
    ]
    try:
        match = wait_for(lambda: re.search(r"metrics: (http://\S+)", log.read_text()))
        worker_url = match.group(1)
        view_url = live_server.url + reverse("delayjobs_metrics")
        wait_for(lambda: jobs_total(scrape(view_url), "scheduled") == 0 and
                 scrape(view_url)["delayjobs_workers"][(("queue", "default"),)] == 2)  # fmt: skip
        schedule_known_jobs()
        wait_for(all_finished, timeout=60)
        # Each process flushes its counts about once a second: wait for every count (the
        # outcomes settle in any order, and a dead job's count may trail the successes).
        counted = lambda url: {o: jobs_total(scrape(url), o) for o in EXPECTED}  # noqa: E731
        wait_for(lambda: counted(view_url) == counted(worker_url) == EXPECTED, timeout=10)
        samples = scrape(view_url)
        from_worker = scrape(worker_url)
        for url in (worker_url, view_url):  # over HTTP too: no token, or a wrong one
            assert status_code(url, None) == 401
            assert status_code(url, TOKEN + "x") == 401
    finally:
        for worker in workers:
            assert stop(worker) == 0

    # Both processes ran jobs, and the one scrape counts them all, exactly.
    ran_by = set(Job.objects.filter(status=Status.SUCCEEDED).values_list("worker", flat=True))
    assert len({w.split(":")[1] for w in ran_by}) == 2, ran_by
    assert {o: jobs_total(samples, o) for o in EXPECTED} == EXPECTED
    assert {o: jobs_total(from_worker, o) for o in EXPECTED} == EXPECTED

    # Lateness: one observation per attempt whose action ran (34 + 6), the 4 jobs that
    # were 40 s overdue between 30 and 60 s, the others well under 10 s.
    name = "delayjobs_lateness_seconds"
    assert samples[f"{name}_count"][(("queue", "default"),)] == 40
    assert bucket(samples, name, "10.0") == bucket(samples, name, "30.0") == 36
    assert bucket(samples, name, "60.0") == bucket(samples, name, "+Inf") == 40
    assert 4 * 40 <= samples[f"{name}_sum"][(("queue", "default"),)] < 4 * 60 + 36 * 10
    # Run time: the 30 slow actions slept 50 ms each.
    name = "delayjobs_run_seconds"
    assert samples[f"{name}_count"][(("queue", "default"),)] == 40
    assert bucket(samples, name, "0.025") <= 10
    assert samples[f"{name}_sum"][(("queue", "default"),)] >= 30 * 0.05

    # Per action: the 30 slow ones succeeded; the 3 failing ones failed twice each, were
    # retried once and died; the 14 of `record` have no series of their own.
    by_action = samples["delayjobs_action_jobs_total"]
    assert {dict(k)["action"] for k in by_action} == set(ACTIONS)
    for action, counts in ((ACTIONS[0], {"succeeded": 30}),
                           (ACTIONS[1], {"failed": 6, "retried": 3, "dead": 3})):  # fmt: skip
        got = {dict(k)["outcome"]: v for k, v in by_action.items() if dict(k)["action"] == action}
        assert got == {o: counts.get(o, 0) for o in layout.WORKER_OUTCOMES}
    run_counts = samples["delayjobs_action_run_seconds_count"]
    assert run_counts == {(("action", ACTIONS[0]), ("queue", "default")): 30,
                          (("action", ACTIONS[1]), ("queue", "default")): 6}  # fmt: skip

    states = samples["delayjobs_queue_jobs"]
    got = {dict(k)["state"]: v for k, v in states.items() if dict(k)["queue"] == "default"}
    assert got == {"pending": 0, "overdue": 0, "ready": 0, "in_flight": 0, "garbage": 3}
    assert samples["delayjobs_oldest_overdue_seconds"][(("queue", "default"),)] == 0
