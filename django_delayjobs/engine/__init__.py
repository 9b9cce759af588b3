"""The Redis engine: ids and due times moved by Lua scripts. Never imports Django."""

from .engine import MAX_BATCH, Engine, PromoteResult, QueueStats, script_source
from .errors import DelayJobsError, EngineUnavailable
from .keys import QueueKeys, validate_name

__all__ = [
    "MAX_BATCH",
    "DelayJobsError",
    "Engine",
    "EngineUnavailable",
    "PromoteResult",
    "QueueKeys",
    "QueueStats",
    "script_source",
    "validate_name",
]
