"""The ``DELAYJOBS`` settings dict, read lazily with defaults (after DRF's api_settings)."""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings

DEFAULTS: dict[str, Any] = {
    "REDIS_URL": "redis://localhost:6379/0",
    "CACHE_ALIAS": None,
    "PREFIX": "delayjobs",
    "DEFAULT_QUEUE": "default",
    "MAX_ATTEMPTS": 5,
    "RETRY_BACKOFF_SECONDS": 10.0,
    "RETRY_BACKOFF_MAX_SECONDS": 3600.0,
    "LEASE_SECONDS": 300.0,
    "TICK_SECONDS": 1.0,
    "RECONCILE_SECONDS": 60.0,
    "RECONCILE_HORIZON_SECONDS": 300.0,
    "HEARTBEAT_SECONDS": 10.0,
    "SHUTDOWN_GRACE_SECONDS": 30.0,
    "BATCH_SIZE": 1000,
    "PREFETCH": 10,
    "REFUSE_EVICTING_REDIS": False,
    "API_PERMISSION_CLASSES": ["rest_framework.permissions.IsAdminUser"],
}


class DelayJobsSettings:
    """Attribute access to ``settings.DELAYJOBS`` with defaults; unknown names raise."""

    def __init__(self) -> None:
        self._cache: dict[str, Any] = {}

    @property
    def user_settings(self) -> dict[str, Any]:
        return dict(getattr(django_settings, "DELAYJOBS", None) or {})

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"unknown DELAYJOBS setting {name!r}")
        if name not in self._cache:
            self._cache[name] = self.user_settings.get(name, DEFAULTS[name])
        return self._cache[name]

    def reload(self) -> None:
        self._cache.clear()


delayjobs_settings = DelayJobsSettings()


def reload_on_change(*, setting: str, **kwargs: Any) -> None:
    """Receiver of ``setting_changed``: drop cached values and the engine."""
    if setting == "DELAYJOBS":
        delayjobs_settings.reload()
        from .connection import reset_engine

        reset_engine()
