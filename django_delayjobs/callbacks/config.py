"""The ``HTTP_*`` settings as typed values, and the checks that ``conf.Settings`` runs on
them (a bad secret or destination is a ``manage.py check`` error, not a surprise at
delivery time)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from ..engine.keys import validate_name
from .headers import check_headers
from .policy import AllowedHost, Refused, Target, check_host, parse_allowed_host, parse_url
from .signing import MAX_SIGNATURES, secret_key

if TYPE_CHECKING:
    from ..conf import Settings

#: A destination's name: what a job row stores instead of a URL (and its secrets).
_DESTINATION = re.compile(r"[a-z][a-z0-9_-]{0,63}")
_DESTINATION_KEYS = frozenset({"url", "headers", "signing_secrets"})
_RATE = re.compile(r"[1-9][0-9]{0,8}/(s|sec|second|m|min|minute|h|hour|d|day)")


@dataclass(frozen=True)
class Destination:
    """One ``HTTP_DESTINATIONS`` entry: a base URL, headers that may hold secrets, and
    optionally its own signing secrets (else ``HTTP_SIGNING_SECRETS``)."""

    name: str
    base: Target
    headers: Mapping[str, str]
    signing_secrets: tuple[str, ...] | None

    def target(self, path: str) -> Target:
        """The base URL with ``path`` (which starts with ``/``) appended to its path."""
        base_path, _, _ = self.base.target.partition("?")
        return Target(self.base.scheme, self.base.host, self.base.port,
                      base_path.rstrip("/") + path)  # fmt: skip


def allowed_hosts(value: object) -> tuple[AllowedHost, ...]:
    if not isinstance(value, list | tuple):
        raise TypeError("must be a list of host names")
    return tuple(parse_allowed_host(entry) for entry in value)


def signing_secrets(value: object) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        raise TypeError("must be a list of 'whsec_...' secrets")
    if len(value) > MAX_SIGNATURES:
        raise ValueError(
            f"holds {len(value)} secrets; at most {MAX_SIGNATURES}: a request carries one "
            f"signature per secret, and a receiver looks at the first {MAX_SIGNATURES} only"
        )
    for secret in value:
        secret_key(secret)
    return tuple(value)


def destination(name: object, spec: object) -> Destination:
    if not isinstance(name, str) or not _DESTINATION.fullmatch(name) or name in ("http", "https"):
        raise ValueError(
            f"destination name {name!r} must be 1 to 64 lower-case letters, digits, '_' or "
            "'-', starting with a letter (and not http or https)"
        )
    if not isinstance(spec, Mapping):
        raise TypeError(f"destination {name!r} must be a dict with 'url'")
    unknown = sorted(set(spec) - _DESTINATION_KEYS, key=str)
    if unknown or "url" not in spec:
        raise ValueError(
            f"destination {name!r} takes 'url' (required), 'headers' and 'signing_secrets'"
            + (f"; not {', '.join(map(repr, unknown))}" if unknown else "")
        )
    base = parse_url(spec["url"])
    if "?" in base.target:
        raise ValueError(f"destination {name!r}: the base URL cannot have a query")
    headers = check_headers(spec.get("headers") or {}, secrets_allowed=True)
    secrets = spec.get("signing_secrets")
    return Destination(name, base, headers, None if secrets is None else signing_secrets(secrets))


def destinations(value: object) -> dict[str, Destination]:
    if not isinstance(value, Mapping):
        raise TypeError("must be a dict of name -> {'url': ..., 'headers': {...}}")
    return {name: destination(name, spec) for name, spec in value.items()}


def status_codes(value: object) -> tuple[int, ...]:
    if not isinstance(value, list | tuple) or not all(
        isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 499
        for code in value
    ):
        raise ValueError("must be a list of 4xx status codes (5xx are always retried)")
    return tuple(value)


def permissions(value: object) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(
        isinstance(perm, str) and re.fullmatch(r"[\w]+\.[\w]+", perm) for perm in value
    ):
        raise ValueError("must be a list of permissions as 'app_label.codename'")
    return tuple(value)


def queue_names(value: object) -> object:
    if value is None:
        return None
    if not isinstance(value, list | tuple) or not value:
        raise ValueError("must be None (any queue) or a list of queue names")
    for name in value:
        validate_name(name, "queue name")
    return value


def destination_names(value: object) -> object:
    if value is not None and (
        not isinstance(value, list | tuple)
        or not all(isinstance(name, str) and _DESTINATION.fullmatch(name) for name in value)
    ):
        raise ValueError("must be None (every destination) or a list of destination names")
    return value


def rate(value: object) -> object:
    if value is not None and (not isinstance(value, str) or not _RATE.fullmatch(value)):
        raise ValueError("must be None or a DRF rate such as '100/minute' or '10/s'")
    return value


def ca_bundle(value: object) -> object:
    # A NUL is in no path: the check's load and every delivery's would fail with ValueError.
    if value is not None and (not isinstance(value, str) or not value or "\x00" in value):
        raise ValueError("must be None (the system's trust store) or the path of a PEM file")
    return value


@dataclass(frozen=True)
class HttpConfig:
    """The ``HTTP_*`` settings, parsed once per settings object."""

    allowed: tuple[AllowedHost, ...]
    allow_private: bool
    secrets: tuple[str, ...]
    destinations: Mapping[str, Destination]
    #: How long a host name's lookup may take: the connect timeout, which it is part of.
    resolve_timeout: float

    @classmethod
    def of(cls, settings: Settings) -> HttpConfig:
        return cls(
            allowed=allowed_hosts(settings.HTTP_ALLOWED_HOSTS),
            allow_private=settings.HTTP_ALLOW_PRIVATE_NETWORKS,
            secrets=signing_secrets(settings.HTTP_SIGNING_SECRETS),
            destinations=destinations(settings.HTTP_DESTINATIONS),
            resolve_timeout=settings.HTTP_CONNECT_TIMEOUT_SECONDS,
        )

    def secrets_for(self, destination: Destination | None) -> Sequence[str]:
        if destination is not None and destination.signing_secrets is not None:
            return destination.signing_secrets
        return self.secrets


_parsed: tuple[object, HttpConfig] | None = None


def current() -> HttpConfig:
    """The configuration in force, parsed once per ``DELAYJOBS`` value."""
    global _parsed
    from ..conf import DelayJobsSettings, delayjobs_settings

    settings = cast(DelayJobsSettings, delayjobs_settings).current()
    cached = _parsed
    if cached is not None and cached[0] is settings:
        return cached[1]
    config = HttpConfig.of(settings)
    _parsed = (settings, config)
    return config


def problems(settings: Settings) -> list[str]:
    """What cannot work across settings (each one is valid alone)."""
    found = []
    config = HttpConfig.of(settings)
    for dest in config.destinations.values():
        try:
            check_host(dest.base, config.allowed)
        except Refused:
            found.append(
                f"HTTP_DESTINATIONS[{dest.name!r}] goes to {dest.base.netloc}, which "
                "HTTP_ALLOWED_HOSTS does not allow: its callbacks would all be refused"
            )
    return found
