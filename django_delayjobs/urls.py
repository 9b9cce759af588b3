"""``path("delayjobs/", include("django_delayjobs.urls"))``: operations endpoints.

``metrics/``: the Prometheus text format (staff or ``METRICS_TOKEN``; docs/metrics.md).
``health/``: 200 or 503 with the names of the checks and ok/fail (no login; see
``health.py`` and docs/operations.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import connections, transaction
from django.urls import URLPattern, path

from .health import health_view
from .metrics.views import metrics

View = Callable[..., Any]


def read_only(view: View) -> View:
    """Mark ``view`` to run outside ``ATOMIC_REQUESTS``: it writes nothing, and Django
    opens the request's transaction before the view runs, so a database that cannot be
    reached was a 500, not the answer the view gives it (health: 503 naming the check).
    The aliases are settings: read as the URLconf loads, once Django is set up."""
    for alias in connections:
        view = transaction.non_atomic_requests(using=alias)(view)
    return view


urlpatterns: list[URLPattern] = [
    path("metrics/", read_only(metrics), name="delayjobs_metrics"),
    path("health/", read_only(health_view), name="delayjobs_health"),
]
