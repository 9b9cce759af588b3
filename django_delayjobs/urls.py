"""``path("delayjobs/", include("django_delayjobs.urls"))``: operations endpoints.

``metrics/``: the Prometheus text format (staff or ``METRICS_TOKEN``; docs/metrics.md).
``health/``: 200 or 503 with the names of the checks and ok/fail (no login; see
``health.py`` and docs/operations.md).
"""

from __future__ import annotations

from django.urls import URLPattern, path

from .health import health_view
from .metrics.views import metrics

urlpatterns: list[URLPattern] = [
    path("metrics/", metrics, name="delayjobs_metrics"),
    path("health/", health_view, name="delayjobs_health"),
]
