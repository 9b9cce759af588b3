"""``path("delayjobs/", include("django_delayjobs.urls"))``: operations endpoints.

``metrics/``: the Prometheus text format (staff or ``METRICS_TOKEN``; docs/metrics.md).
``health/``: 200 or 503 with the names of the checks and ok/fail (no login; see
``health.py`` and docs/operations.md).
"""

from __future__ import annotations

from django.urls import URLPattern, path

from .health import health_view
from .metrics.views import metrics
from .request_transactions import outside_django

# Both run outside ``ATOMIC_REQUESTS``: they write nothing, and Django opens the request's
# transaction before a view runs, so a database that cannot be reached was a 500, not the
# answer the view gives it (health: 503 naming the check; metrics: Redis's figures).
urlpatterns: list[URLPattern] = [
    path("metrics/", outside_django(metrics), name="delayjobs_metrics"),
    path("health/", outside_django(health_view), name="delayjobs_health"),
]
