"""The admin in a real headless Chromium (Debian's ``chromium``, driven by Playwright).

Skipped, with the reason, when the ``playwright`` package or a ``chromium`` binary is
missing (``.ci/run`` installs both). Playwright's own browser download is not used.

Set ``DELAYJOBS_SCREENSHOTS=docs/img`` to refresh the documentation's screenshots.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections
from django.urls import reverse

from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.models import EventKind, Job, Status
from tests.testapp import tasks
from tests.testapp.models import Thing

sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is missing")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip(
        "no chromium binary on PATH (Debian: apt-get install chromium)", allow_module_level=True
    )

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
PASSWORD = "browser-test-password"


@pytest.fixture(autouse=True)
def _sync_orm_beside_playwright(monkeypatch):
    # Playwright's sync API keeps an asyncio loop running in this thread, so Django
    # would refuse ORM calls made by the test between browser steps. They are sync
    # calls on the test's own thread, which is what this switch allows.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield chromium
        finally:
            chromium.close()
            # Inside Playwright's loop Django keeps its connections apart from the test's
            # own; left open, one would keep PostgreSQL from dropping the test database.
            connections.close_all()


@pytest.fixture
def superuser(django_user_model):
    return django_user_model.objects.create_superuser("boss", "boss@example.com", PASSWORD)


def burst(queue: str) -> None:
    call_command("run_delayworker", "--burst", "-v", "0", "--queues", queue)


def dead_job(label: str, queue: str = "default") -> Job:
    job = schedule(tasks.fail, in_=0, args=[label], max_attempts=1, queue=queue)
    burst(queue)
    job.refresh_from_db()
    assert job.status == Status.DEAD
    return job


def log_in(page: Any, base_url: str, next_url: str) -> None:
    page.goto(f"{base_url}{reverse('admin:login')}?next={next_url}")
    page.fill("#id_username", "boss")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{base_url}{next_url}")


def garbage_cell(page: Any, queue: str) -> Any:
    return page.locator(f'#delayjobs-summary tr[data-queue="{queue}"] td[data-count="garbage"]')


def test_requeue_a_dead_job_from_the_queue_page(browser, live_server, superuser):
    dead = dead_job("browser")
    page = browser.new_page()
    page.set_default_timeout(15_000)
    app_index = reverse("admin:app_list", args=["django_delayjobs"])
    log_in(page, live_server.url, app_index)

    page.click("#delayjobs-queues-link")
    page.wait_for_url(f"{live_server.url}{reverse('admin:django_delayjobs_queues')}")
    assert page.title().startswith("Queue state and garbage")
    sync_api.expect(garbage_cell(page, "default")).to_have_text("1")
    row = page.locator(f'#garbage-default tr[data-job="{dead.pk}"]')
    sync_api.expect(row).to_contain_text("failing on purpose: browser")

    row.get_by_role("button", name="Requeue").click()
    sync_api.expect(page.locator("ul.messagelist")).to_contain_text("1 dead job requeued.")
    sync_api.expect(garbage_cell(page, "default")).to_have_text("0")
    sync_api.expect(page.locator("#garbage-default")).to_contain_text("No dead job.")

    dead.refresh_from_db()
    assert dead.status == Status.SCHEDULED
    assert dead.events.last().kind == EventKind.REQUEUED
    assert dead.events.last().actor == "admin:boss"
    assert get_engine().stats("default").garbage == 0


def test_purge_asks_first_then_deletes(browser, live_server, superuser):
    dead = dead_job("purge me")
    page = browser.new_page()
    page.set_default_timeout(15_000)
    log_in(page, live_server.url, reverse("admin:django_delayjobs_queues"))
    page.locator(f'#garbage-default tr[data-job="{dead.pk}"]').get_by_role(
        "button", name="Purge"
    ).click()
    sync_api.expect(page.locator("#content")).to_contain_text("will be deleted for good")
    assert Job.objects.filter(pk=dead.pk).exists()
    page.get_by_role("button", name="Yes, purge them").click()
    sync_api.expect(page.locator("ul.messagelist")).to_contain_text("1 dead job purged.")
    sync_api.expect(garbage_cell(page, "default")).to_have_text("0")
    assert not Job.objects.filter(pk=dead.pk).exists()


def _scene() -> Job:
    """A few queues with pending, retrying and dead jobs and a live worker, for pictures."""
    for n in range(3):
        thing = Thing.objects.create(name=f"order {n}")
        schedule(thing.expire, in_=600 + 300 * n, kwargs={"reason": "unpaid"}, queue="orders",
                 key=f"order-{thing.pk}-autocancel")  # fmt: skip
    schedule(tasks.record, in_=45, args=["receipt"], queue="mail")
    retrying = schedule(tasks.record, in_=120, args=["stock"], queue="mail")
    Job.objects.filter(pk=retrying.pk).update(status=Status.RETRYING, attempts=1)
    dead_job("payment provider timed out", queue="orders")
    shown = dead_job("SMTP server said 451", queue="mail")
    info = {"host": "web-1", "pid": 4242, "roles": ["promoter", "worker"], "concurrency": 4}
    for queue in ("orders", "mail"):
        get_engine().heartbeat(queue, "web-1:4242", 30_000, {**info, "queues": ["orders", "mail"]})
    return shown


def _background(page: Any, selector: str) -> tuple[int, ...]:
    color = page.eval_on_selector(selector, "e => getComputedStyle(e).backgroundColor")
    return tuple(int(c) for c in re.findall(r"\d+", color)[:3])


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_pages_follow_the_admin_theme_and_make_screenshots(
    browser, live_server, superuser, scheme, tmp_path
):
    dead = _scene()
    context = browser.new_context(color_scheme=scheme, viewport={"width": 1440, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    queues = reverse("admin:django_delayjobs_queues")
    log_in(page, live_server.url, queues)
    page.click("#toggle-nav-sidebar")  # more room for the tables (the admin remembers it)

    # The admin's own stylesheet is served and the page follows its theme.
    body = _background(page, "body")
    assert (sum(body) > 600) == (scheme == "light"), body
    assert _background(page, "#header") != body
    sync_api.expect(garbage_cell(page, "orders")).to_have_text("1")
    pages = {"queues": queues}
    page.screenshot(path=tmp_path / f"queues-{scheme}.png", full_page=True)

    jobs = reverse("admin:django_delayjobs_job_changelist")
    page.goto(live_server.url + jobs)
    sync_api.expect(page.locator("#result_list")).to_contain_text("testapp.Thing.expire")
    sync_api.expect(page.locator("#changelist-filter")).to_contain_text("orders")
    pages["jobs"] = jobs
    page.screenshot(path=tmp_path / f"jobs-{scheme}.png", full_page=True)

    detail = reverse("admin:django_delayjobs_job_change", args=[dead.pk])
    page.goto(live_server.url + detail)
    sync_api.expect(page.locator("pre.delayjobs-pre").first).to_contain_text("SMTP server")
    error_bg = _background(page, "pre.delayjobs-pre")
    assert (sum(error_bg) > 600) == (scheme == "light"), error_bg
    pages["job"] = detail
    page.screenshot(path=tmp_path / f"job-{scheme}.png", full_page=True)
    context.close()

    for name in pages:
        assert (tmp_path / f"{name}-{scheme}.png").stat().st_size > 10_000
    target = os.environ.get("DELAYJOBS_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        for name in pages:
            shutil.copy(
                tmp_path / f"{name}-{scheme}.png", Path(target) / f"admin-{name}-{scheme}.png"
            )
