"""The lead's audit, 2026-11-30 (evening): start-up's reading of Redis's version."""

import pytest

from django_delayjobs.exceptions import ConfigurationError
from django_delayjobs.preflight import redis_version


@pytest.mark.parametrize(
    ("given", "read"),
    [("6.2.14", (6, 2)), ("7.2.4-rc1", (7, 2)), ("255.0", (255, 0)), ("10.10.10", (10, 10))],
)
def test_the_version_a_redis_compatible_server_reports_is_read(given, read):
    assert redis_version({"redis_version": given}) == read


@pytest.mark.parametrize("given", ["unstable", "", "7", "v7.2", None])
def test_a_version_that_cannot_be_read_stops_start_up_with_a_clear_error(given):
    info = {} if given is None else {"redis_version": given}
    with pytest.raises(ConfigurationError, match="cannot read the version of the Redis server"):
        redis_version(info, " (master 10.0.0.1:6379)")
