"""The ``DELAYJOBS`` settings: one typed schema, read by the settings object and the checks.

``Settings`` is a frozen dataclass: each field's type and bounds say what a value may be.
``validate()`` checks a user's dict against it and returns every problem; the system
checks report those, and ``delayjobs_settings`` (lazy, so ``override_settings`` works)
refuses to hand out values from a dict that has any. A setting is added here, once.
"""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, NamedTuple, Union, cast, get_args, get_origin, get_type_hints

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured

from .callbacks import config as http
from .engine.keys import validate_name
from .exceptions import ConfigurationError
from .serialization import short_repr

Validator = Callable[[Any], object]


def setting(
    default: Any = MISSING,
    low: float | None = None,
    high: float | None = None,
    *,
    check: Validator | None = None,
    factory: Callable[[], Any] | None = None,
    kind: str | None = None,
    secret: bool = False,
) -> Any:
    """A field of ``Settings``: a default, inclusive bounds, and an extra value check that
    raises ``TypeError``/``ValueError``/``ImproperlyConfigured`` with a message. ``kind``
    names the system check id family of its problems (default: from the type). A
    ``secret`` one's problems name the type of a wrong value, never the value (a check
    or a start-up error is printed, and logged)."""
    metadata = {"low": low, "high": high, "check": check, "kind": kind, "secret": secret}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def _name(what: str) -> Validator:
    return lambda value: validate_name(value, what)


def _token(value: Any) -> object:
    """A bearer token worth the name: long, and sendable in an HTTP header as it is."""
    if value is None:
        return None
    if len(value) < 16 or not all(33 <= ord(c) <= 126 for c in value):
        raise ValueError(
            "must be at least 16 printable ASCII characters without spaces "
            "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return value


def _metrics_actions(value: Sequence[Any]) -> None:
    from .metrics.layout import check_actions

    check_actions(value)


def _shard_counts(value: Mapping[Any, Any]) -> object:
    from .engine.routing import check_counts

    return check_counts(value)


def _permission_classes(value: Any) -> object:
    from .rest.permissions import load_permissions  # DRF only when there is a value

    return load_permissions(value)


def _http(check: Validator, default: Any = MISSING, **kwargs: Any) -> Any:
    """An ``HTTP_*`` setting checked by a function of ``callbacks.config``."""
    return setting(default, check=check, kind="http", **kwargs)


@dataclass(frozen=True)
class Settings:
    """Every ``DELAYJOBS`` setting with its type, default and bounds (docs/settings.md)."""

    REDIS_URL: str = setting("redis://localhost:6379/0", secret=True)  # its password
    CACHE_ALIAS: str | None = None
    #: A Redis Cluster: REDIS_URL names any one node (a seed); the client finds the rest.
    REDIS_CLUSTER: bool = False
    #: Queue name -> number of shards (1 to MAX_SHARDS); a queue not listed has 1.
    QUEUE_SHARDS: Mapping[str, int] = setting(factory=dict, check=_shard_counts, kind="shards")
    PREFIX: str = setting("delayjobs", check=_name("prefix"))
    DEFAULT_QUEUE: str = setting("default", check=_name("queue name"))
    MAX_ATTEMPTS: int = setting(5, 1, 5000)
    #: Deliveries of one attempt that never recorded an outcome (its worker was lost)
    #: before the job is dead: the bound on a job that kills its worker every time.
    MAX_DELIVERIES: int = setting(3, 1, 100)
    RETRY_BACKOFF_SECONDS: float = setting(10.0, 0, 86_400)
    RETRY_BACKOFF_MAX_SECONDS: float = setting(3600.0, 0, 30 * 86_400)
    LEASE_SECONDS: float = setting(300.0, 1, 86_400)
    TICK_SECONDS: float = setting(1.0, 0.05, 60)
    RECONCILE_SECONDS: float = setting(60.0, 1, 86_400)
    RECONCILE_HORIZON_SECONDS: float = setting(300.0, 1, 366 * 86_400)
    HEARTBEAT_SECONDS: float = setting(10.0, 0.1, 3600)
    SHUTDOWN_GRACE_SECONDS: float = setting(30.0, 0, 86_400)
    #: The longest an action may run: past it the attempt fails and the worker process
    #: exits 1 for its supervisor to restart it (a running thread cannot be stopped).
    #: None: no limit.
    MAX_RUN_SECONDS: float | None = setting(3600.0, 1, 30 * 86_400)
    BATCH_SIZE: int = setting(1000, 1, 5000)
    PREFETCH: int = setting(10, 1, 5000)
    #: The most bytes of JSON a job stores for its arguments (args and kwargs together)
    #: and for its return value, as ``json.dumps`` writes them: far below what jsonb holds.
    MAX_JSON_BYTES: int = setting(1 << 20, 1024, 1 << 26)
    REFUSE_EVICTING_REDIS: bool = False
    #: The bearer token that opens the ``metrics/`` view (None: staff sessions only).
    METRICS_TOKEN: str | None = setting(None, check=_token, kind="type", secret=True)
    #: Hours of per-minute counts kept in Redis for the admin's charts.
    METRICS_HISTORY_HOURS: int = setting(3, 1, 48)
    #: Actions with series of their own (an ``action`` label); bounded, so opt-in.
    METRICS_ACTIONS: Sequence[str] = setting(factory=list, check=_metrics_actions, kind="type")
    #: Workers delete finished jobs this much older than their finish (None: never).
    PRUNE_AFTER_SECONDS: float | None = setting(None, 60, 36_500 * 86_400)
    # Classes or dotted paths, checked by DRF's own loader (setting() returns a field()).
    API_PERMISSION_CLASSES: Any = setting(  # noqa: RUF009
        factory=lambda: ["rest_framework.permissions.IsAdminUser"],
        check=_permission_classes,
        kind="permissions",
    )
    # -- HTTP callbacks (docs/callbacks.md) --
    HTTP_ALLOWED_HOSTS: Sequence[str] = _http(http.allowed_hosts, factory=list)
    HTTP_ALLOW_PRIVATE_NETWORKS: bool = False
    HTTP_SIGNING_SECRETS: Sequence[str] = _http(http.signing_secrets, factory=list, secret=True)
    # Its headers (Authorization...) and signing secrets.
    HTTP_DESTINATIONS: Mapping[str, Any] = _http(http.destinations, factory=dict, secret=True)
    HTTP_CA_BUNDLE: str | None = _http(http.ca_bundle, None)
    HTTP_CONNECT_TIMEOUT_SECONDS: float = setting(5.0, 0.01, 300)
    HTTP_READ_TIMEOUT_SECONDS: float = setting(10.0, 0.01, 3600)
    HTTP_TIMEOUT_SECONDS: float = setting(30.0, 0.01, 3600)
    HTTP_RESPONSE_KEEP_BYTES: int = setting(4096, 0, 65536)
    HTTP_MAX_REQUEST_BYTES: int = setting(65536, 1, 1 << 20)
    HTTP_RETRY_STATUSES: Sequence[int] = _http(http.status_codes, factory=lambda: [408, 429])
    HTTP_RETRY_AFTER_MAX_SECONDS: float = setting(3600.0, 0, 86_400)
    HTTP_SIGNATURE_TOLERANCE_SECONDS: float = setting(300.0, 1, 86_400)
    API_CALLBACK_PERMISSIONS: Sequence[str] = _http(
        http.permissions, factory=lambda: ["django_delayjobs.add_job"]
    )
    API_CALLBACK_THROTTLE_RATE: str | None = _http(http.rate, None)
    #: The queues ``callbacks/`` callers may name (None: any). Each new name costs Redis
    #: keys and a directory entry for good, and every queue page, ``queues/`` answer and
    #: metrics scrape then reads it: a list keeps callers out of new ones.
    API_CALLBACK_QUEUES: Sequence[str] | None = _http(http.queue_names, None)
    #: The ``HTTP_DESTINATIONS`` (with their credentials) ``callbacks/`` callers may name
    #: (None: every one; ``[]``: none, plain URLs only).
    API_CALLBACK_DESTINATIONS: Sequence[str] | None = _http(http.destination_names, None)


NAMES = frozenset(f.name for f in fields(Settings))
_HINTS = get_type_hints(Settings)
#: Defaults by name, for messages and docs.
DEFAULTS: dict[str, Any] = {name: getattr(Settings(), name) for name in NAMES}


class Problem(NamedTuple):
    """One thing wrong with ``DELAYJOBS``; ``kind`` picks the system check id."""

    name: str | None
    message: str
    kind: str  # "dict", "unknown", "float", "int", "name", "type", "permissions", "http", "shards"


def _type_error(value: Any, hint: Any) -> str | None:
    """What is wrong with ``value``'s type for the annotation ``hint``, or None."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        errors = [_type_error(value, arg) for arg in get_args(hint)]
        return None if None in errors else " or ".join(filter(None, errors))
    if hint is Any:
        return None
    if hint is type(None):
        return None if value is None else "None"
    if hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        # Not math.isfinite(): it converts an int to float, which overflows past 1.8e308.
        return None if ok and abs(value) <= sys.float_info.max else "a finite number"
    if hint is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else "an int"
    if hint is bool:
        return None if isinstance(value, bool) else "True or False"
    if hint is str:
        return None if isinstance(value, str) else "a str"
    if origin is Sequence:
        return None if isinstance(value, list | tuple) else "a list"
    if origin is Mapping:
        return None if isinstance(value, Mapping) else "a dict"
    return None if isinstance(value, origin or hint) else f"a {getattr(hint, '__name__', hint)}"


def _kind(hint: Any, metadata: Mapping[str, Any]) -> str:
    if metadata.get("kind"):
        return str(metadata["kind"])
    if metadata.get("check") is not None:
        return "name"
    return {float: "float", int: "int"}.get(hint, "type")


def _a(noun: str) -> str:
    """``a list``, ``an int``: how a secret's value is named (its type only)."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _field_problem(name: str, value: Any) -> Problem | None:
    spec = Settings.__dataclass_fields__[name]
    hint = _HINTS[name]
    kind = _kind(hint, spec.metadata)
    wrong = _type_error(value, hint)
    shown = _a(type(value).__name__) if spec.metadata.get("secret") else short_repr(value)
    if wrong is not None:
        return Problem(name, f"must be {wrong}, not {shown}", kind)
    low, high = spec.metadata.get("low"), spec.metadata.get("high")
    # None: an optional setting switched off.
    if value is not None and (
        (low is not None and value < low) or (high is not None and value > high)
    ):
        return Problem(name, f"must be from {low} to {high}, not {shown}", kind)
    check = spec.metadata.get("check")
    if check is not None:
        try:
            check(value)
        except (TypeError, ValueError, ImproperlyConfigured) as exc:
            return Problem(name, str(exc), kind)
    return None


def validate(user: object) -> tuple[Settings | None, list[Problem]]:
    """Check a ``DELAYJOBS`` value; return the settings it gives (None if it has problems)
    and every problem found."""
    if user is None:
        return Settings(), []
    if not isinstance(user, dict):
        return None, [Problem(None, f"must be a dict, not {type(user).__name__}", "dict")]
    problems = [
        Problem(name, f"is not a setting (known: {', '.join(sorted(NAMES))})", "unknown")
        for name in sorted(set(user) - NAMES, key=str)
    ]
    for name in sorted(NAMES & set(user)):
        problem = _field_problem(name, user[name])
        if problem is not None:
            problems.append(problem)
    if problems:
        return None, problems
    return Settings(**user), []


def bounds(name: str) -> tuple[float, float]:
    """The inclusive range of a numeric setting (the same range for options that override it)."""
    metadata = Settings.__dataclass_fields__[name].metadata
    return metadata["low"], metadata["high"]


def describe(problem: Problem) -> str:
    where = f"DELAYJOBS[{problem.name!r}]" if problem.name is not None else "DELAYJOBS"
    return f"{where} {problem.message}"


class DelayJobsSettings:
    """``settings.DELAYJOBS`` as a validated ``Settings``, built on first use.

    Unknown names raise ``AttributeError``; a dict with any problem raises
    ``ConfigurationError`` naming all of them (``manage.py check`` lists them too).
    """

    #: Never missing, even while ``reload`` runs: a read then finds None, not no attribute.
    _current: Settings | None = None

    def __init__(self) -> None:
        # Taken to fill the cache and to empty it, never to read a value already kept: a
        # reload cannot slip between a read's check and its store, so no value of the
        # settings it replaced is kept after it.
        self._lock = threading.RLock()

    def current(self) -> Settings:
        current = self._current
        if current is None:
            with self._lock:
                if self._current is None:
                    loaded, problems = validate(getattr(django_settings, "DELAYJOBS", None))
                    if loaded is None:
                        raise ConfigurationError("; ".join(describe(p) for p in problems))
                    self._current = loaded
                current = self._current
        return current

    def __getattr__(self, name: str) -> Any:
        # Called for a name not yet read since the last reload only: the value is kept as
        # an attribute, so that a hot path's reads cost no call (this method, current()
        # and a getattr were three per read).
        if name not in NAMES:
            raise AttributeError(f"unknown DELAYJOBS setting {name!r}")
        with self._lock:
            value = self.__dict__[name] = getattr(self.current(), name)
        return value

    def reload(self) -> None:
        with self._lock:
            self._current = None
            for name in NAMES:
                self.__dict__.pop(name, None)


#: Typed as ``Settings`` so that every read is type-checked.
delayjobs_settings = cast(Settings, DelayJobsSettings())


def reload_on_change(*, setting: str, **kwargs: Any) -> None:
    """Receiver of ``setting_changed``: drop cached values and the engine."""
    if setting == "DELAYJOBS":
        cast(DelayJobsSettings, delayjobs_settings).reload()
        from .connection import reset_engine

        reset_engine()
