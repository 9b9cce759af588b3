"""``path("delayjobs/", include("django_delayjobs.urls"))``: operations endpoints.

``metrics/``: the Prometheus text format (staff or ``METRICS_TOKEN``; docs/metrics.md).
"""

from __future__ import annotations

from django.urls import URLPattern, path

from .metrics.views import metrics

urlpatterns: list[URLPattern] = [
    path("metrics/", metrics, name="delayjobs_metrics"),
]
