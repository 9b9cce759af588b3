"""``schema/``: this API's OpenAPI 3 document. Imported only when drf-spectacular is."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from drf_spectacular.views import SpectacularAPIView

from .formats import SafeFormats
from .permissions import permissions_for


def _version() -> str:
    try:
        return version("django-delayjobs")
    except PackageNotFoundError:  # a source checkout that was not installed
        return "dev"


class SchemaView(SafeFormats, SpectacularAPIView):
    """The OpenAPI document of the delayjobs endpoints only (YAML; JSON with ?format=json)."""

    custom_settings = {
        "TITLE": "django-delayjobs API",
        "DESCRIPTION": "Jobs, their history, cancel/reschedule/requeue, and queue state.",
        "VERSION": _version(),
        # drf-spectacular takes hooks by dotted path only (a list of objects is refused).
        "PREPROCESSING_HOOKS": ["django_delayjobs.rest.schema.only_delayjobs"],
    }

    def get_permissions(self) -> list[Any]:
        return permissions_for(write=False)
