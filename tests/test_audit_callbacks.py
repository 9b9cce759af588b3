"""Audit of HTTP callbacks: failing tests first, moved to their modules once fixed."""

from __future__ import annotations

import json

import pytest

from django_delayjobs.models import Job
from tests.test_callbacks_rest import HOOK, admin, http  # noqa: F401

from .test_rest_helpers import url

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    "body",
    [
        {"a": "\ud800"},  # a lone surrogate: not UTF-8
        {"a": "x" * 70_000},  # over HTTP_MAX_REQUEST_BYTES
    ],
)
def test_a_json_body_that_cannot_be_sent_is_a_400_naming_json(admin, body):  # noqa: F811
    """The client sent ``json``: the 400 names that field, not ``data`` it never sent."""
    payload = json.dumps({"url": HOOK, "in": 1, "json": body})  # \ud800 escaped: valid JSON
    response = admin.post(url("callbacks"), payload, content_type="application/json")
    assert response.status_code == 400, response.content
    assert list(response.json()) == ["json"], response.json()
    assert not Job.objects.exists()
