"""The audit trail tells the truth: every job's history, complete and in order, wherever
it is shown, however long it is."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from django_delayjobs import schedule
from django_delayjobs.models import EventKind, JobEvent
from django_delayjobs.sql import insert_events
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def retried(times: int, error: str = "boom") -> tuple[str, list[tuple[str, str]]]:
    """A job with the history of ``times`` failed attempts (its events as the worker writes
    them: a started and a failed per attempt, many in the same microsecond)."""
    job = schedule(tasks.record, in_=60, args=["a"])
    events = []
    for attempt in range(1, times + 1):
        job.attempts = attempt
        events += [(job, EventKind.STARTED, "worker:w", f"attempt {attempt}"),
                   (job, EventKind.FAILED, "worker:w", f"{error} {attempt}")]  # fmt: skip
    insert_events(events)  # one timestamp for all of them: only the id orders them
    wanted = list(JobEvent.objects.filter(job=job).order_by("id").values_list("kind", "message"))
    return str(job.pk), wanted


def shown(html: str) -> list[tuple[str, str]]:
    rows = re.findall(
        r'<tr class="form-row" data-kind="(\w+)">.*?<td class="field-message_display">(.*?)</td>',
        html, re.S,
    )  # fmt: skip
    return [(kind, message) for kind, message in rows]


@pytest.mark.slow
def test_the_admin_pages_a_long_history_completely_and_in_order(admin_client):
    """A job retried 1,000 times has 2,001 events: the change page rendered every one of
    them (with up to 64 KiB of traceback each, a page of over 100 MB). It shows a page of
    them at a time, with links to the others; read page by page, the history is complete,
    in order, each event once."""
    pk, wanted = retried(1000)
    url = reverse("admin:django_delayjobs_job_change", args=[pk])
    html = admin_client.get(url).content.decode()
    first = shown(html)
    assert 0 < len(first) <= 200
    assert first == wanted[: len(first)]
    seen, page = [], 1
    while True:
        response = admin_client.get(url, {"history": page})
        assert response.status_code == 200
        rows = shown(response.content.decode())
        seen += rows
        if not re.search(rf'href="\?history={page + 1}#', response.content.decode()):
            break
        page += 1
    assert seen == wanted
    assert page == 21  # 100 a page; a page number that is no page: the nearest (Django's rule)
    for asked, expected in (("x", wanted[:100]), ("99999", wanted[2000:]), ("-1", wanted[2000:])):
        assert shown(admin_client.get(url, {"history": asked}).content.decode()) == expected
