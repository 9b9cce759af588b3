import os

import pytest
from redis._parsers import _HiredisParser


def test_engine_round_trip(engine):
    now = engine.server_time_ms()
    assert engine.add("q", {"a": now - 1}) == ["a"]
    assert engine.claim("q", 1, 1000) == ["a"]
    assert engine.ack("q", ["a"]) == 1


@pytest.mark.skipif("hiredis" not in os.environ.get("DELAYJOBS_EXTRAS", "").split(","),
                    reason="a venv built without the hiredis extra")  # fmt: skip
def test_a_venv_with_the_hiredis_extra_talks_to_redis_through_hiredis(engine):
    # CI builds the Python 3.13 venv with it: that pass must really use hiredis's parser.
    engine.server_time_ms()
    connection = engine.client.connection_pool.get_connection()
    try:
        assert isinstance(connection._parser, _HiredisParser)
    finally:
        engine.client.connection_pool.release(connection)
