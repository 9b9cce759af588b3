"""Who may read the metrics: a staff user who may view jobs, or a caller with the token.

The token (``METRICS_TOKEN``) comes as ``Authorization: Bearer <token>`` and is compared
in constant time. A scraper that sends a wrong token is refused even if it also carries a
staff session: a wrong token is a misconfiguration worth seeing at once.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser

from ..conf import delayjobs_settings

PERMISSIONS = ("django_delayjobs.view_job", "django_delayjobs.change_job")


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (None without one)."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip()


def token_ok(given: str | None) -> bool:
    expected = delayjobs_settings.METRICS_TOKEN
    if expected is None or given is None:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def allowed(headers: Mapping[str, str], user: AbstractBaseUser | AnonymousUser | None) -> bool:
    """True for a right token, or for no token and an active staff user who may view jobs."""
    given = bearer(headers.get("Authorization"))
    if given is not None:
        return token_ok(given)
    if user is None or not user.is_active or not getattr(user, "is_staff", False):
        return False
    has_perm = getattr(user, "has_perm", None)  # a custom user model may lack it
    return callable(has_perm) and any(has_perm(p) for p in PERMISSIONS)
