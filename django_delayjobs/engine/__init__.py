"""The Redis engine: ids and due times moved by Lua scripts. Never imports Django."""

from .engine import MAX_BATCH, Engine, close_client, script_source
from .errors import DelayJobsError, EngineUnavailable, PartlyUnavailable, PerShard, WrongType
from .keys import QueueKeys, is_valid_name, validate_name
from .results import Added, Leased, PromoteResult, QueueStats
from .sharding import MAX_SHARDS, Shard, queue_of
from .validation import PRIORITY_RANGE

__all__ = [
    "MAX_BATCH",
    "MAX_SHARDS",
    "PRIORITY_RANGE",
    "Added",
    "DelayJobsError",
    "Engine",
    "EngineUnavailable",
    "Leased",
    "PartlyUnavailable",
    "PerShard",
    "PromoteResult",
    "QueueKeys",
    "QueueStats",
    "Shard",
    "WrongType",
    "close_client",
    "is_valid_name",
    "queue_of",
    "script_source",
    "validate_name",
]
