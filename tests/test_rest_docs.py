"""docs/api.md stays true: every documented request is sent to the API, in order, and the
answer must have the documented status code and the same shape (keys, recursively) as the
documented body; ``status`` and ``detail`` must match word for word. Ids, times and user
data (args, kwargs, result, counters) are free to differ."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.urls import resolve

from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from tests.testapp import tasks
from tests.testapp.models import Thing

from .test_rest_helpers import client_for, dead_job, make_user

pytestmark = pytest.mark.django_db(transaction=True)

DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"
FENCE = re.compile(r"^```http\n(.*?)^```$", re.MULTILINE | re.DOTALL)
#: Values the caller chose (or counted): their inner keys are data, not shape.
FREE_FORM = {"args", "kwargs", "result", "counters"}
#: Compared word for word where the documented body has them at the top.
EXACT = ("status", "detail")
#: The ids the document uses, and the job of the test's world each stands for.
DOC_IDS = {
    "7c3f9a1e-2b4d-4e8f-9a6b-1d2e3f4a5b6c": "order",
    "5e8d2c4b-6a7f-4b3e-8c1d-0f9e8d7c6b5a": "reminder",
    "b1e2d3c4-a5f6-4789-8abc-def012345678": "dead",
}


@dataclass
class Example:
    method: str
    path: str
    body: Any
    status: int
    expected: Any

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


def split(block: str) -> tuple[str, list[str], Any]:
    head, _, body = block.partition("\n\n")
    first, *headers = head.splitlines()
    return first, headers, json.loads(body) if body.strip() else None


def examples(text: str) -> list[Example]:
    """The request/response pairs of a document, in order."""
    blocks = [split(b) for b in FENCE.findall(text)]
    found = []
    for (request, _, body), (status, _, expected) in zip(blocks[::2], blocks[1::2], strict=True):
        method, path, _ = request.split(" ")
        assert status.startswith("HTTP/1.1 "), f"no response after {request}"
        found.append(Example(method, path, body, int(status.split()[1]), expected))
    return found


def same_shape(got: Any, expected: Any, where: str = "body") -> None:
    if isinstance(expected, dict):
        assert isinstance(got, dict), f"{where}: not an object: {got!r}"
        assert set(got) == set(expected), f"{where}: keys {sorted(got)} != {sorted(expected)}"
        for key, value in expected.items():
            if key not in FREE_FORM:
                same_shape(got[key], value, f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(got, list), f"{where}: not a list: {got!r}"
        assert bool(got) == bool(expected), f"{where}: {len(got)} items, documented {len(expected)}"
        for i, (item, documented) in enumerate(zip(got, expected, strict=False)):
            same_shape(item, documented, f"{where}[{i}]")
    else:
        assert (got is None) == (expected is None), f"{where}: {got!r}, documented {expected!r}"


@pytest.fixture
def world(redis_client):
    """The jobs the document talks about: an order's auto-cancel, a reminder, a dead job,
    and a live worker."""
    thing = Thing.objects.create()
    jobs = {
        "order": schedule(thing.expire, in_=1800, kwargs={"reason": "unpaid"},
                          key=f"thing-{thing.pk}-autocancel"),
        "reminder": schedule(tasks.record, in_=7200, args=["reminder"]),
        "dead": dead_job(),
    }  # fmt: skip
    info = {"host": "web-1", "pid": 4242, "roles": ["promoter", "worker"], "concurrency": 4,
            "queues": ["default"]}  # fmt: skip
    get_engine().heartbeat("default", "web-1:4242", 30_000, info)
    return {doc_id: str(jobs[role].pk) for doc_id, role in DOC_IDS.items()}


def send(api, example: Example, ids: dict[str, str]) -> Any:
    path = example.path
    for doc_id, real in ids.items():
        path = path.replace(doc_id, real)
    if example.method == "GET":
        return api.get(path)
    data = "" if example.body is None else json.dumps(example.body)
    return api.generic(example.method, path, data, content_type="application/json")


def test_every_endpoint_is_documented():
    names = {resolve(e.path.partition("?")[0]).url_name for e in examples(DOC.read_text())}
    assert names == {"job-list", "job-detail", "job-events", "job-cancel", "job-reschedule",
                     "job-requeue", "queues"}  # fmt: skip


def test_documented_examples_are_true(world):
    api = client_for(make_user(superuser=True))
    found = examples(DOC.read_text())
    assert len(found) >= 10
    for example in found:
        response = send(api, example, world)
        got = json.loads(response.content) if response.content else None
        assert response.status_code == example.status, (str(example), got)
        same_shape(got, example.expected, str(example))
        for key in EXACT:
            if isinstance(example.expected, dict) and key in example.expected:
                assert got[key] == example.expected[key], (str(example), key)
