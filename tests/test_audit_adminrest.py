"""Audit of the admin and the API under hostile requests and least privilege, fifth
round: each test fails on the code it was written against (its docstring says what is
wrong)."""

from __future__ import annotations

import pytest

from django_delayjobs import schedule
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _clean_redis(redis_client):
    """Every test starts from an empty Redis database."""


@pytest.mark.parametrize("term", ["\x00", "k\x00"])
def test_the_admin_autocomplete_of_jobs_takes_a_nul_without_a_500(admin_client, term):
    """Django's autocomplete view searches jobs through JobAdmin.get_search_results (for
    JobEvent.job), past the job list's refusal of NUL characters: PostgreSQL refused the
    term with a DataError, a 500. No stored key or target id holds a NUL: nothing found."""
    schedule(tasks.record, in_=3600, args=["x"], key="k")
    query = {"app_label": "django_delayjobs", "model_name": "jobevent", "field_name": "job",
             "term": term}  # fmt: skip
    response = admin_client.get("/admin/autocomplete/", query)
    assert response.status_code == 200
    assert response.json()["results"] == []
