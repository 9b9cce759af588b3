"""The queue page's charts: per-minute history read from Redis, drawn as inline SVG with a
table of the numbers, after real worker runs (in-process ``--burst``)."""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.core.management import call_command
from django.urls import reverse

from django_delayjobs import schedule
from django_delayjobs.admin import charts
from django_delayjobs.connection import get_engine
from django_delayjobs.metrics import history, layout, store
from django_delayjobs.metrics.recorder import RECORDER
from django_delayjobs.models import Job, Status
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

QUEUES = "admin:django_delayjobs_queues"


@pytest.fixture(autouse=True)
def _clean(redis_client, settings):
    """An empty Redis, no counts left in this process's recorder by another test, and
    retries due at once (so a burst runs them)."""
    RECORDER.take()
    RECORDER.snapped.clear()
    settings.DELAYJOBS = {**settings.DELAYJOBS, "RETRY_BACKOFF_SECONDS": 0}


def burst(queue: str = "default") -> None:
    call_command("run_delayworker", "--burst", "-v", "0", "--queues", queue)


def run_known_jobs(queue: str = "default") -> None:
    """6 succeed, 2 fail twice (retried, then dead), 1 is skipped, 2 are cancelled."""
    # What a running worker's housekeeping does every second: scheduled and cancelled jobs
    # per minute are counted from the snapshot its first flush of a minute takes.
    RECORDER.flush(get_engine(), [queue])
    for n in range(6):
        schedule(tasks.record, in_=0, args=[f"ok{n}"], queue=queue)
    for n in range(2):
        schedule(tasks.fail, in_=0, args=[f"bad{n}"], max_attempts=2, queue=queue)
    job = schedule(tasks.record, in_=0, args=["gone"], queue=queue)
    Job.objects.filter(pk=job.pk).update(expires_at=job.run_at)  # past its expiry
    for n in range(2):
        assert schedule(tasks.record, in_=600, args=[f"c{n}"], queue=queue).cancel()
    burst(queue)
    assert Job.objects.filter(queue=queue, status=Status.DEAD).count() == 2


def table(html: str, chart_id: str) -> tuple[list[str], list[list[str]]]:
    figure = re.search(rf'<figure class="delayjobs-chart" id="{chart_id}">(.*?)</figure>', html,
                       re.S).group(1)  # fmt: skip
    head = [unescape(c) for c in re.findall(r'<th scope="col"[^>]*>(.*?)</th>', figure)]
    body = re.search(r"<tbody>(.*?)</tbody>", figure, re.S).group(1)
    rows = [[unescape(c) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)]  # fmt: skip
    return head, [r for r in rows if len(r) == len(head)]  # not "No job in this period."


def column_sums(head: list[str], rows: list[list[str]]) -> dict[str, int]:
    return {name: sum(int(r[i]) for r in rows) for i, name in enumerate(head) if i}


def test_the_charts_count_what_a_worker_run_did(admin_client):
    run_known_jobs()
    html = admin_client.get(reverse(QUEUES)).content.decode()
    assert 'id="delayjobs-charts"' in html
    head, rows = table(html, "delayjobs-throughput")
    assert head == ["Minute", "succeeded", "skipped", "retried", "dead", "scheduled", "cancelled"]
    assert 1 <= len(rows) <= 2  # the run may straddle a minute
    assert column_sums(head, rows) == {"succeeded": 6, "skipped": 1, "retried": 2, "dead": 2,
                                       "scheduled": 11, "cancelled": 2}  # fmt: skip
    head, rows = table(html, "delayjobs-lateness")
    assert head == ["Minute", "Jobs started", "p50", "p99"]
    assert sum(int(r[1]) for r in rows) == 6 + 2 * 2  # every attempt whose action ran
    assert all(r[2].endswith(" ms") or r[2].endswith(" s") for r in rows)
    # Each stacked series has its bars, the lines their points, the SVG its description.
    for series in ("succeeded", "skipped", "retried", "dead"):
        assert f'<rect class="delayjobs-s-{series}"' in html
    assert '<polyline class="delayjobs-s-scheduled"' in html
    assert 'role="img" aria-labelledby="delayjobs-throughput-title' in html
    assert "The last 3 hours" in html


def test_with_no_history_the_charts_say_so(admin_client):
    html = admin_client.get(reverse(QUEUES)).content.decode()
    assert html.count("No job in this period.") == 2
    assert "<rect " not in html and "<polyline " not in html


def test_a_queue_can_be_chosen_and_a_bad_choice_shows_all(admin_client):
    run_known_jobs("mail")
    schedule(tasks.record, in_=600, args=["x"])  # the default queue: scheduled, not run
    url = reverse(QUEUES)
    mail = admin_client.get(url, {"charts": "mail"}).content.decode()
    assert "Jobs per minute &ndash; mail" in mail
    head, rows = table(mail, "delayjobs-throughput")
    assert column_sums(head, rows)["succeeded"] == 6
    default = admin_client.get(url, {"charts": "default"}).content.decode()
    head, rows = table(default, "delayjobs-throughput")
    assert column_sums(head, rows).get("succeeded", 0) == 0
    for bad in ("<script>alert(1)</script>", "nope", "a" * 500, ""):
        html = admin_client.get(url, {"charts": bad}).content.decode()
        assert "<script>alert" not in html
        assert "Jobs per minute</figcaption>" in html  # all queues
        assert column_sums(*table(html, "delayjobs-throughput"))["succeeded"] == 6


def test_no_charts_when_redis_is_unreachable(admin_client, settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": "redis://127.0.0.1:1/0"}
    html = admin_client.get(reverse(QUEUES)).content.decode()
    assert "Redis is unreachable" in html and 'id="delayjobs-charts"' not in html


def test_a_viewer_sees_the_charts(client, django_user_model):
    from django.contrib.auth.models import Permission

    viewer = django_user_model.objects.create_user("v", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(viewer)
    assert 'id="delayjobs-charts"' in client.get(reverse(QUEUES)).content.decode()


# -- history: scheduled and cancelled per minute from the snapshots --------------------------


def put_snapshots(queue: str, values: dict[int, tuple[int, int]]) -> None:
    engine = get_engine()
    for minute, (added, removed) in values.items():
        key = store.minute_key(engine, queue, minute)
        engine.client.hset(key, mapping={"snap:added": added, "snap:removed": removed})


def test_scheduled_per_minute_is_the_difference_of_snapshots():
    engine = get_engine()
    schedule(tasks.record, in_=600, args=["a"])  # the engine's counter: added = 1 now
    now = engine.server_time_ms() // 60_000
    put_snapshots("default", {now - 4: (10, 0), now - 3: (15, 1), now - 1: (40, 1), now: (0, 0)})
    minutes = {m.minute: m.jobs for m in history.read(engine, ["default"], 6, now=now)}
    assert minutes[now - 4] == {"scheduled": 5, "cancelled": 1}
    assert minutes[now - 3] == {}  # the next minute has no snapshot: unknown, not zero
    assert minutes[now - 1] == {}  # the next snapshot is lower: a reset, from zero
    assert minutes[now] == {"scheduled": 1}  # from the snapshot to the counter now
    assert minutes[now - 5] == {}


def test_a_counter_reset_is_not_a_negative_count():
    engine = get_engine()
    now = engine.server_time_ms() // 60_000
    put_snapshots("default", {now - 2: (500, 0), now - 1: (3, 0)})  # Redis lost its data
    minutes = {m.minute: m.jobs for m in history.read(engine, ["default"], 3, now=now)}
    assert minutes[now - 2] == {"scheduled": 3}


# -- the drawing ------------------------------------------------------------------------------


def test_stacked_bars_stay_inside_the_plot_and_lines_follow_the_counts():
    minutes = [history.Minute(m) for m in range(100, 280)]
    minutes[10].jobs = {"succeeded": 40, "retried": 7, "dead": 3}
    minutes[11].jobs = {"scheduled": 55, "cancelled": 5}
    chart = charts.throughput(minutes, [str(m.minute) for m in minutes])
    assert [b.series for b in chart.bars] == ["succeeded", "retried", "dead"]
    bottom = charts.TOP + charts.PLOT_H
    assert chart.bars[0].y + chart.bars[0].h == pytest.approx(bottom, abs=0.2)
    assert chart.bars[2].y >= charts.TOP
    assert chart.bars[0].h / chart.bars[1].h == pytest.approx(40 / 7, rel=0.05)
    assert [t.label for t in chart.y_ticks] == ["0", "50", "100"]  # top: 55 -> 100
    assert {s for s, _ in chart.lines} == {"scheduled", "cancelled"}
    assert len(chart.rows) == 2


def test_lateness_is_drawn_on_a_log_scale_with_gaps_for_quiet_minutes():
    minutes = [history.Minute(m) for m in range(0, 60)]
    for i in (5, 6, 7, 30):
        minutes[i].lateness = {layout.bucket_field("lateness", 0.004): 99,
                               layout.bucket_field("lateness", 3.0): 1}  # fmt: skip
    chart = charts.lateness(minutes, [str(i) for i in range(60)])
    assert [s for s, _ in chart.lines] == ["p50", "p99"]  # minutes 5-7: one run each
    assert [(d.series, len(chart.lines[0][1].split())) for d in chart.dots] == [
        ("p50", 3), ("p99", 3)]  # fmt: skip  # minute 30 alone: a dot
    assert charts._y_log(0.001) == charts.TOP + charts.PLOT_H
    assert charts._y_log(60) == charts.TOP
    assert charts._y_log(10**6) == charts.TOP and charts._y_log(0) == charts.TOP + charts.PLOT_H
    # 99 in (2 ms, 5 ms], 1 in (2 s, 5 s]: p50 and p99 both fall in the first bucket.
    assert chart.rows[0] == ["5", "100", "3.5 ms", "5.0 ms"]
    assert [r[0] for r in chart.rows] == ["5", "6", "7", "30"]
