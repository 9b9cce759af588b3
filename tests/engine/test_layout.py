"""The engine's shape: one Cluster slot per queue, documented scripts, no Django.

The hash slot is computed here from the Redis Cluster specification, not taken from a
library: slot = CRC16-XMODEM(tag) mod 16384, where tag is the part between the first
``{`` and the first ``}`` after it when that part is not empty, else the whole key.
Reference values, from the specification and ``CLUSTER KEYSLOT`` on a real cluster:
CRC16("123456789") = 0x31C3; slot("somekey") = 11058; slot("foo{hash_tag}") = 2515.
"""

from __future__ import annotations

import ast
import re
from importlib import resources
from pathlib import Path

import pytest

import django_delayjobs.engine as engine_pkg
from django_delayjobs.engine import Engine, QueueKeys, is_valid_name, validate_name

ENGINE_DIR = Path(engine_pkg.__file__).parent
SCRIPTS = sorted(resources.files(engine_pkg).joinpath("scripts").iterdir(), key=lambda p: p.name)
LUA = [p for p in SCRIPTS if p.name.endswith(".lua")]


def crc16_xmodem(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def hash_tag(key: str) -> str:
    start = key.find("{")
    if start != -1:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def key_slot(key: str) -> int:
    return crc16_xmodem(hash_tag(key).encode()) % 16384


# -- the rule itself ----------------------------------------------------------------------


def test_crc16_matches_the_reference_value():
    assert crc16_xmodem(b"123456789") == 0x31C3
    assert crc16_xmodem(b"") == 0


@pytest.mark.parametrize(
    ("key", "tag"),
    [
        ("{user1000}.following", "user1000"),
        ("foo{}{bar}", "foo{}{bar}"),  # empty first tag: the whole key is hashed
        ("foo{{bar}}zap", "{bar"),
        ("foo{bar}{zap}", "bar"),
        ("no tag", "no tag"),
        ("open{only", "open{only"),
    ],
)
def test_hash_tag_extraction_follows_the_cluster_spec(key, tag):
    assert hash_tag(key) == tag


def test_key_slot_matches_cluster_keyslot():
    assert key_slot("somekey") == 11058
    assert key_slot("foo{hash_tag}") == 2515
    assert key_slot("{user1000}.following") == key_slot("{user1000}.followers")


# -- the engine's keys --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "queue"),
    [("delayjobs", "default"), ("t", "q"), ("p.x-y_z", "Orders.EU-1_b"), ("a" * 64, "b" * 64)],
)
def test_every_key_of_a_queue_shares_one_hash_slot(prefix, queue):
    keys = list(QueueKeys.for_queue(prefix, queue))
    assert len(keys) == len(set(keys)) == len(QueueKeys.__dataclass_fields__)
    assert {hash_tag(k) for k in keys} == {f"{prefix}:{queue}"}
    assert len({key_slot(k) for k in keys}) == 1


def test_queues_of_one_prefix_are_not_forced_into_one_slot():
    slots = {key_slot(QueueKeys.for_queue("delayjobs", f"q{i}").pending) for i in range(50)}
    assert len(slots) > 40  # each queue can live on its own node


NAMES = ["orders", "a", "A.b-c_9", "x" * 64, "", "x" * 65, "a b", "a:b", "{a}", "a#1/2", "é",
         "a\n", "a\x00", None, 7, b"orders"]  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
def test_is_valid_name_answers_what_validate_name_does(name):
    try:
        validate_name(name, "queue")
    except (TypeError, ValueError):
        assert is_valid_name(name) is False
    else:
        assert is_valid_name(name) is True


def test_the_key_names_of_a_queue():
    keys = QueueKeys.for_queue("delayjobs", "orders")
    assert keys.ready == "{delayjobs:orders}:ready"
    assert keys.ready_set == "{delayjobs:orders}:ready_set"
    assert list(keys) == [f"{{delayjobs:orders}}:{name}" for name in QueueKeys.__dataclass_fields__]
    assert {"pending", "ready", "ready_set", "unack", "garbage"} <= set(
        QueueKeys.__dataclass_fields__
    )


def test_every_key_an_engine_uses_is_tagged(redis_client):
    engine = Engine(redis_client, prefix="t")  # not the fixture of this folder: pure names
    for key in engine.keys("q"):
        assert key.startswith("{t:q}:")
    assert hash_tag(engine.queues_key) == "t"


# -- the scripts ----------------------------------------------------------------------------


def _split(source: str) -> tuple[list[str], str]:
    """Return the leading comment lines and the code with every comment removed."""
    lines = source.splitlines()
    header = []
    for line in lines:
        if not line.startswith("--"):
            break
        header.append(line)
    code = "\n".join(re.sub(r"--.*$", "", line) for line in lines)
    return header, code


#: Commands whose every argument is a key (checked to be KEYS[n], below).
MULTI_KEY = {"EXISTS"}


def test_each_engine_script_is_shipped_and_loaded():
    names = {p.name.removesuffix(".lua") for p in LUA}
    engine_py = (ENGINE_DIR / "engine.py").read_text()
    assert len(names) >= 12
    for name in names:
        assert f'"{name}"' in engine_py, f"{name}.lua is not registered by engine.py"


@pytest.mark.parametrize("script", LUA, ids=lambda p: p.name)
def test_script_header_documents_keys_argv_and_return(script):
    header, code = _split(script.read_text())
    text = "\n".join(header)
    assert len(header) >= 3, "a script starts with a comment header"
    used = sorted(set(re.findall(r"KEYS\[(\d+)\]", code)), key=int)
    documented = set(re.findall(r"KEYS\[(\d+)\]\s*=", text))
    assert used, "every script touches at least one key"
    assert set(used) <= documented, f"KEYS used but not documented: {set(used) - documented}"
    if "ARGV" in code:
        assert re.search(r"ARGV(\[\d+\])?\s*=", text), "ARGV is used but not documented"
    assert re.search(r"^-- returns ", text, re.M), "the header says what the script returns"


@pytest.mark.parametrize("script", LUA, ids=lambda p: p.name)
def test_script_builds_no_key_names(script):
    _, code = _split(script.read_text())
    assert ".." not in code, "no string concatenation: keys come only through KEYS"
    assert not re.search(r"\bKEYS\[[^\]0-9]", code), "KEYS is indexed by literals only"
    assert "EVAL" not in code.upper().replace("EVALSHA", "")
    calls = list(re.finditer(r"redis\.p?call\(\s*'(\w+)'\s*(?:,\s*([^,)]+))?", code))
    assert len(calls) == len(re.findall(r"redis\.p?call\b", code)), "a call this test cannot read"
    for call in calls:
        command, first = call.group(1).upper(), call.group(2)
        if command == "TIME":
            assert first is None
            continue
        assert first is not None, f"{command} without a key"
        assert re.fullmatch(r"KEYS\[\d+\]", first.strip()), (
            f"{command}'s key is {first.strip()!r}, not KEYS[n]"
        )
    # A command of several keys names nothing but KEYS (all in the queue's hash tag).
    for command in MULTI_KEY:
        pattern = rf"redis\.p?call\(\s*'{command}'"
        whole = rf"{pattern}(\s*,\s*KEYS\[\d+\])+\s*\)"
        assert len(re.findall(pattern, code, re.I)) == len(re.findall(whole, code, re.I)), (
            f"{command} with an argument that is not KEYS[n]"
        )


def test_scripts_only_use_commands_of_a_single_slot():
    # Commands that take no key, or several unrelated ones, would hide cross-slot access.
    allowed = {
        "TIME", "ZADD", "ZREM", "ZSCORE", "ZRANGE", "ZRANGEBYSCORE", "ZCARD", "ZCOUNT",
        "LPUSH", "RPUSH", "LPOP", "LTRIM", "LLEN",
        "SADD", "SREM", "SISMEMBER", "SCARD", "SRANDMEMBER",
        "HSET", "HDEL", "HINCRBY", "HGETALL", "HLEN", "HMGET",
        "GET", "SET",  # claim's record of what a call took (claims.py)
    } | MULTI_KEY  # fmt: skip
    for script in LUA:
        _, code = _split(script.read_text())
        used = {c.upper() for c in re.findall(r"redis\.p?call\(\s*'(\w+)'", code)}
        assert used <= allowed, f"{script.name}: {used - allowed}"


def test_no_script_walks_a_list_or_set():
    # The ready LIST may hold 100,000s of ids: membership is asked of ready_set (O(1)),
    # never found by walking the list (LPOS, LREM) or reading a whole key.
    scans = {"LPOS", "LREM", "LRANGE", "LINDEX", "LINSERT", "LSET", "SMEMBERS", "SSCAN",
             "SINTER", "SUNION", "SDIFF", "KEYS", "SCAN", "SORT"}  # fmt: skip
    for script in LUA:
        _, code = _split(script.read_text())
        used = {c.upper() for c in re.findall(r"redis\.p?call\(\s*'(\w+)'", code)}
        assert not used & scans, f"{script.name}: {used & scans}"


@pytest.mark.parametrize("script", LUA, ids=lambda p: p.name)
def test_every_push_to_ready_also_adds_to_ready_set(script):
    # ready_set is the truth of "in ready": a push to the LIST without SADD would leave an
    # entry that claim takes for a tombstone, and the job would never run.
    header, code = _split(script.read_text())
    keys = dict(re.findall(r"KEYS\[(\d+)\]\s*=\s*(\w+)", "\n".join(header)))
    ready = [n for n, name in keys.items() if name == "ready"]
    pushes = [
        c for c in re.findall(r"redis\.call\('([LR]PUSH)', KEYS\[(\d+)\]", code) if c[1] in ready
    ]
    if pushes:
        ready_set = [n for n, name in keys.items() if name == "ready_set"]
        assert len(ready_set) == 1, "a script that pushes to ready declares ready_set"
        adds = re.findall(rf"redis\.call\('SADD', KEYS\[{ready_set[0]}\]", code)
        assert len(adds) == len(pushes), f"{len(pushes)} pushes to ready, {len(adds)} SADDs"


# -- no Django below engine/ --------------------------------------------------------------


def _imports(path: Path) -> list[tuple[str, int]]:
    """Return (module, level) for every import in a source file, wherever it appears."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.module or "", node.level))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "__import__":
            found.append(("__import__", 0))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            found.append(("import_module", 0))
    return found


def test_the_engine_imports_no_django_module():
    sources = sorted(ENGINE_DIR.rglob("*.py"))
    assert {p.name for p in sources} >= {"__init__.py", "engine.py", "keys.py"}
    for path in sources:
        for module, level in _imports(path):
            top = module.split(".")[0]
            where = f"{path.relative_to(ENGINE_DIR)} imports {module!r}"
            assert top != "django", where
            assert top not in ("rest_framework", "django_redis"), where
            assert module not in ("__import__", "import_module"), f"{where}: dynamic import"
            # Relative imports stay inside engine/; an absolute one into the package
            # would run django_delayjobs/__init__.py, which may import Django.
            assert level <= 1, where
            assert top != "django_delayjobs" or module.startswith("django_delayjobs.engine")


# -- shards ---------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [2, 6, 64])
def test_every_key_of_a_shard_shares_one_slot_and_shards_do_not_share_tags(count):
    from django_delayjobs.engine.sharding import Shard, slot, tag

    tags = set()
    for k in range(count):
        shard_tag = tag("delayjobs", Shard("orders", k, count))
        keys = list(QueueKeys.for_tag(shard_tag))
        assert {hash_tag(key) for key in keys} == {shard_tag}
        assert len({key_slot(key) for key in keys}) == 1
        assert slot(shard_tag) == key_slot(keys[0])  # the engine's CRC16 is the spec's
        assert "{" not in shard_tag and "}" not in shard_tag
        tags.add(shard_tag)
    assert len(tags) == count


def test_a_queue_of_one_shard_keeps_the_tag_it_always_had():
    from django_delayjobs.engine.sharding import Shard, tag

    assert tag("delayjobs", Shard("orders")) == "delayjobs:orders"
    assert QueueKeys.for_tag("delayjobs:orders") == QueueKeys.for_queue("delayjobs", "orders")


def test_jump_hash_spreads_ids_evenly_and_moves_few_when_the_count_grows():
    from django_delayjobs.engine.sharding import home

    ids = [f"job-{i}" for i in range(60_000)]
    six = [home("q", 6, i).index for i in ids]
    counts = [six.count(k) for k in range(6)]
    assert max(counts) / min(counts) < 1.05, counts
    seven = [home("q", 7, i).index for i in ids]
    moved = [(a, b) for a, b in zip(six, seven, strict=True) if a != b]
    assert all(b == 6 for _, b in moved)  # growing 6 -> 7 moves ids only to the new shard
    assert 0.12 < len(moved) / len(ids) < 0.16  # about 1/7 of them
