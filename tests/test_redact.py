"""URLs in messages: no password, token or part of one is ever shown, however the URL
is malformed (``redact.without_userinfo``, ``redact.url_problem``)."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from django_delayjobs.callbacks.policy import Refused, parse_url
from django_delayjobs.redact import url_problem, without_userinfo

SECRET = "s3cret"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@redis.internal:6379/0", "redis://***@redis.internal:6379/0"),
        ("redis://user:s3cret@host", "redis://***@host"),
        ("redis://user:p@s3cret@host/1", "redis://***@host/1"),  # "@" in the password
        ("redis://user:pa/s3cret@host:6379", "redis://***@host:6379"),  # unencoded "/"
        ("redis://user:pa?s3cret@host", "redis://***@host"),
        ("redis://user:pa#s3cret@host", "redis://***@host"),
        ("redis://:/s3cret@host", "redis://***@host"),
        ("user:s3cret@host:6379", "***@host:6379"),  # no scheme
        ("//user:s3cret@host", "//***@host"),
        ("unix://:s3cret@/run/redis.sock", "unix://***@/run/redis.sock"),
        ("redis://host:6379/0?password=s3cret", "redis://host:6379/0?password=***"),
        ("redis://host?db=1&PASSWORD=s3cret&x=1", "redis://host?db=1&PASSWORD=***&x=1"),
        ("https://hooks.example/in?token=s3cret#x", "https://hooks.example/in?token=***#x"),
        ("https://a:s3cret@h/?api_key=s3cret", "https://***@h/?api_key=***"),
        # Session ids and bearer tokens by the names frameworks give them.
        ("https://h/in?sessionid=s3cret&x=1", "https://h/in?sessionid=***&x=1"),
        ("https://h/in?jwt=s3cret", "https://h/in?jwt=***"),
        ("https://h/in?bearer=s3cret", "https://h/in?bearer=***"),
    ],
)
def test_secrets_are_masked(url, shown):
    assert without_userinfo(url) == shown
    assert SECRET not in without_userinfo(url)


@pytest.mark.parametrize(
    "url",
    [
        "redis://host:6379/0",
        "https://host/p?e=a@b",  # an "@" after the authority is not user information
        "https://host:443/p?e=a@b",
        "http://[::1]/p@x",
        "http://[::1]:8080/p@x",
        "unix:///tmp/redis@1.sock",
        "",
        "not a url at all",
        "\x00\n\u202e",
    ],
)
def test_urls_without_secrets_are_shown_as_they_are(url):
    assert without_userinfo(url) == url


def test_a_url_that_cannot_be_split_is_described_without_the_password():
    """urlsplit's message quotes the port's text: for a password holding "/", that text
    is the password's start (netloc "user:pa", port "pa")."""
    url = "redis://user:s3cret/x@host:6379"
    with pytest.raises(ValueError, match=SECRET):
        _ = urlsplit(url).port  # what the message showed
    assert SECRET not in url_problem(url)
    assert "percent-encode" in url_problem(url)
    assert url_problem("redis://host:99999") == "Port out of range 0-65535"
    assert url_problem("redis://host:6379") is None


def test_a_refused_callback_url_shows_no_part_of_the_password():
    with pytest.raises(Refused) as refused:
        parse_url("https://user:s3cret/x@example.com/hook")
    assert SECRET not in str(refused.value)


def test_check_e013_shows_no_part_of_the_password(settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_CLUSTER": True,
                          "REDIS_URL": "redis://user:s3cret/x@redis.internal:6379"}  # fmt: skip
    with pytest.raises(SystemCheckError) as raised:
        call_command("check")
    assert "E013" in str(raised.value)
    assert SECRET not in str(raised.value)
