"""What a hostile value can do to the logs: forge a worker's line with control characters
or ANSI escapes, or show a secret that redis-py would read from a URL."""

from __future__ import annotations

import pytest

from django_delayjobs.connection import cluster_url_problem
from django_delayjobs.redact import without_userinfo

SECRET = "s3cret"


@pytest.mark.parametrize(
    "url",
    [
        "redis://h:6379/0?pass%77ord=s3cret",  # redis-py decodes the names (parse_qs)
        "redis://h:6379/0?%70assword=s3cret",
        "https://hooks.example/in?client_secret=s3cret",
        "https://hooks.example/in?x-api-key=s3cret",
        "https://hooks.example/in?private_token=s3cret",
        "https://hooks.example/in?access-token=s3cret",
    ],
)
def test_a_credential_query_value_is_masked_whatever_its_name_is_spelled(url):
    assert SECRET not in without_userinfo(url)


def test_a_cluster_url_problem_shows_no_percent_encoded_password():
    problem = cluster_url_problem("redis://h:6379/1?pass%77ord=s3cret")
    assert problem is not None and "database other than 0" in problem
    assert SECRET not in problem
