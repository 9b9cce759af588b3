"""System checks for the ``DELAYJOBS`` settings: clear messages instead of odd failures."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured

from .conf import DEFAULTS
from .engine import validate_name

_POSITIVE = (
    "RETRY_BACKOFF_SECONDS", "RETRY_BACKOFF_MAX_SECONDS", "LEASE_SECONDS", "TICK_SECONDS",
    "RECONCILE_SECONDS", "RECONCILE_HORIZON_SECONDS", "HEARTBEAT_SECONDS",
)  # fmt: skip


def _error(msg: str, hint: str, n: int) -> Error:
    return Error(msg, hint=hint, id=f"django_delayjobs.E{n:03d}")


@register(Tags.compatibility)
def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[Error | Warning]:
    """Report unknown names and bad values in ``settings.DELAYJOBS``."""
    user = getattr(settings, "DELAYJOBS", None)
    if user is None:
        return []
    if not isinstance(user, dict):
        return [_error("DELAYJOBS must be a dict.", "DELAYJOBS = {'REDIS_URL': ...}", 1)]
    errors: list[Error | Warning] = [
        _error(f"DELAYJOBS has an unknown setting {name!r}.",
               f"Known settings: {', '.join(sorted(DEFAULTS))}.", 2)
        for name in sorted(set(user) - set(DEFAULTS))
    ]  # fmt: skip
    for name in _POSITIVE:
        value = user.get(name, DEFAULTS[name])
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            errors.append(_error(f"DELAYJOBS[{name!r}] must be a positive number.",
                                 f"Got {value!r}.", 3))  # fmt: skip
    for name in ("MAX_ATTEMPTS", "BATCH_SIZE", "PREFETCH"):
        value = user.get(name, DEFAULTS[name])
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 5000:
            errors.append(_error(f"DELAYJOBS[{name!r}] must be an int from 1 to 5000.",
                                 f"Got {value!r}.", 4))  # fmt: skip
    for name, what in (("PREFIX", "prefix"), ("DEFAULT_QUEUE", "queue name")):
        try:
            validate_name(user.get(name, DEFAULTS[name]), what)
        except (TypeError, ValueError) as exc:
            errors.append(_error(f"DELAYJOBS[{name!r}]: {exc}.", "Change the setting.", 5))
    url, alias = user.get("REDIS_URL"), user.get("CACHE_ALIAS")
    if url is not None and not isinstance(url, str):
        errors.append(_error("DELAYJOBS['REDIS_URL'] must be a str.", f"Got {url!r}.", 6))
    if alias is not None and alias not in settings.CACHES:
        errors.append(_error(f"DELAYJOBS['CACHE_ALIAS'] = {alias!r} is not in CACHES.",
                             f"Known caches: {', '.join(settings.CACHES)}.", 7))  # fmt: skip
    every = user.get("RECONCILE_SECONDS", DEFAULTS["RECONCILE_SECONDS"])
    horizon = user.get("RECONCILE_HORIZON_SECONDS", DEFAULTS["RECONCILE_HORIZON_SECONDS"])
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (every, horizon))
    if numbers and horizon < every:
        errors.append(Warning(
            "DELAYJOBS['RECONCILE_HORIZON_SECONDS'] is shorter than RECONCILE_SECONDS: a job "
            "lost by Redis may then run up to RECONCILE_SECONDS late.",
            hint="Make the horizon at least as long as the sweep interval.",
            id="django_delayjobs.W001",
        ))  # fmt: skip
    if "API_PERMISSION_CLASSES" in user:
        from .rest.permissions import load_permissions

        try:
            load_permissions(user["API_PERMISSION_CLASSES"])
        except ImproperlyConfigured as exc:
            errors.append(_error(f"{exc}.", "List DRF permission classes by dotted path.", 8))
    return errors
