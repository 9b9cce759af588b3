"""Audit ops2: failing tests for the bugs found (moved to their modules once fixed)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from tests.helpers import database_down


@pytest.mark.django_db(transaction=True)
def test_database_down_gives_503_to_a_staff_session_too(tmp_path):
    """The session and its user are read from the database: with it down, a staff user's
    scrape was a 500 (the error escaped from the access check), not the 503 the docs
    promise when the database cannot be reached."""
    client = Client(raise_request_exception=False)
    client.force_login(User.objects.create_user("boss", password="pw", is_staff=True,
                                                is_superuser=True))  # fmt: skip
    with database_down(tmp_path):
        response = client.get(reverse("delayjobs_metrics"))
    assert response.status_code == 503
    assert response.content == b"the database is unavailable\n"
