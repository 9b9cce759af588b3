"""Who may read the metrics: a staff user who may view jobs, or a caller with the token.

The token (``METRICS_TOKEN``) comes as ``Authorization: Bearer <token>`` and is compared
in constant time. A scraper that sends a wrong token is refused even if it also carries a
staff session: a wrong token is a misconfiguration worth seeing at once. The worker's port
without a token listens on a loopback address only, and answers only requests for a
loopback ``Host``: a web page on that host's browser that reaches it through DNS
rebinding (a name of its own, resolved again to 127.0.0.1) sends its own name.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Mapping

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.http.request import split_domain_port

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


def loopback(host: str) -> bool:
    """True if only this machine reaches ``host``: a loopback address or ``localhost``."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:  # any other name may resolve to any address
        return False


def loopback_host(header: str | None) -> bool:
    """Whether a ``Host`` header (with or without a port) names a loopback address or
    ``localhost``: a browser sends the name the page used, which no rebinding changes."""
    domain, _ = split_domain_port(header or "")
    return bool(domain) and loopback(domain)
