"""``path("api/delayjobs/", include("django_delayjobs.rest.urls"))``."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path
from rest_framework.routers import SimpleRouter

from .callbacks import CallbackCancelView, CallbackCreateView, CallbackRescheduleView
from .schema import spectacular_installed
from .views import JobViewSet, QueuesView

app_name = "delayjobs_api"

router = SimpleRouter()
router.register("jobs", JobViewSet, basename="job")

urlpatterns: list[URLPattern | URLResolver] = [
    *router.urls,
    path("queues/", QueuesView.as_view(), name="queues"),
    path("callbacks/", CallbackCreateView.as_view(), name="callbacks"),
    path("callbacks/cancel/", CallbackCancelView.as_view(), name="callbacks-cancel"),
    path("callbacks/reschedule/", CallbackRescheduleView.as_view(), name="callbacks-reschedule"),
]

if spectacular_installed():
    from .schema_view import SchemaView

    urlpatterns.append(path("schema/", SchemaView.as_view(), name="schema"))
