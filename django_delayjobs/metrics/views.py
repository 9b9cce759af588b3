"""``metrics/`` under ``include("django_delayjobs.urls")``: the Prometheus text format.

Every answer is uncached: 401 (with ``WWW-Authenticate: Bearer``) without a staff session
or the right token, 403 for a logged-in user who is not a staff user allowed to view jobs,
503 when Redis or the database is unreachable, or the settings give no Redis client
(Prometheus then records the target as down, the signal to alert on), 501 when
``prometheus_client`` is missing.
"""

from __future__ import annotations

import logging

from django.contrib.auth.decorators import login_not_required
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from ..connection import get_engine
from ..engine import EngineUnavailable
from ..exceptions import ConfigurationError
from . import access, snapshot

logger = logging.getLogger("django_delayjobs.metrics")


def _text(status: int, body: str) -> HttpResponse:
    return HttpResponse(body + "\n", status=status, content_type="text/plain; charset=utf-8")


# Its own access control (token or staff user): a project's LoginRequiredMiddleware
# must not send Prometheus, token in hand, to the login page.
@login_not_required
@never_cache
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    """GET/HEAD: the whole deployment's metrics, for a staff user or the token's holder."""
    user = getattr(request, "user", None)
    try:
        allowed = access.allowed(request.headers, user)  # reads METRICS_TOKEN
    except ConfigurationError as exc:  # an invalid DELAYJOBS: a web process runs no checks
        logger.error("metrics: the DELAYJOBS settings cannot work (%s)", exc)
        return _text(503, "the DELAYJOBS settings cannot work")
    except DatabaseError as exc:  # a session's user is read from the database
        logger.warning("metrics: the database is unavailable (%s)", exc)
        return _text(503, "the database is unavailable")
    if not allowed:
        # A Bearer token that is wrong is 401; other credentials (a site behind HTTP Basic
        # auth sends them on every request) do not make a logged-in user anonymous.
        given = access.bearer(request.headers.get("Authorization"))
        if given is None and user is not None and user.is_authenticated:
            return _text(403, "metrics need a staff user who may view jobs")
        response = _text(401, "metrics need a staff login or the METRICS_TOKEN bearer token")
        response["WWW-Authenticate"] = 'Bearer realm="delayjobs metrics"'
        return response
    try:
        from . import exposition
    except ImportError:
        return _text(
            501,
            "metrics need prometheus_client, the extra django-delayjobs[metrics]: "
            "pip install prometheus-client",
        )
    unreadable: dict[str, str] = {}
    try:
        readings = snapshot.read(get_engine(), unreadable)
    except ConfigurationError as exc:  # passed manage.py check, yet gives no Redis client
        logger.error("metrics: the DELAYJOBS settings cannot work (%s)", exc)
        return _text(503, "the DELAYJOBS settings cannot work")
    except EngineUnavailable as exc:
        logger.warning("metrics: Redis is unavailable (%s)", exc)
        return _text(503, "Redis is unavailable")
    except DatabaseError as exc:  # the due time of a ready job is its row's
        logger.warning("metrics: the database is unavailable (%s)", exc)
        return _text(503, "the database is unavailable")
    snapshot.log_unreadable(logger, unreadable)
    body = exposition.render(readings, unreadable)
    return HttpResponse(body, content_type=exposition.CONTENT_TYPE)
