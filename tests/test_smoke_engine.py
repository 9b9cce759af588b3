def test_engine_round_trip(engine):
    now = engine.server_time_ms()
    assert engine.add("q", {"a": now - 1}) == ["a"]
    assert engine.claim("q", 1, 1000) == ["a"]
    assert engine.ack("q", ["a"]) == 1
