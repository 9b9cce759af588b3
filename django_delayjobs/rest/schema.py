"""OpenAPI for the API through drf-spectacular, when it is installed (extra ``api-schema``).

Without it the views work the same; only ``schema/`` is not served.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def spectacular_installed() -> bool:
    try:
        import drf_spectacular  # noqa: F401
    except ImportError:
        return False
    return True


def document(**kwargs: Any) -> Callable[[F], F]:
    """``extend_schema(**kwargs)`` when drf-spectacular is installed, else nothing. Every
    endpoint answers 503 while the database cannot (``formats.DatabaseUnavailable``)."""
    if not spectacular_installed():
        return lambda fn: fn
    from drf_spectacular.openapi import AutoSchema
    from drf_spectacular.utils import extend_schema

    from .serializers import DetailSerializer

    if isinstance(kwargs.get("responses"), dict):
        kwargs["responses"] = {**kwargs["responses"], 503: DetailSerializer}

    def decorate(fn: F) -> F:
        # extend_schema builds on the schema class it finds here, else on the project's
        # DEFAULT_SCHEMA_CLASS, which need not be drf-spectacular's.
        fn.__dict__.setdefault("kwargs", {}).setdefault("schema", AutoSchema)
        return extend_schema(**kwargs)(fn)

    return decorate


def field_schema(schema: dict[str, Any]) -> Callable[[F], F]:
    """``extend_schema_field(schema)`` when drf-spectacular is installed, else nothing."""
    if not spectacular_installed():
        return lambda cls: cls
    from drf_spectacular.utils import extend_schema_field

    return extend_schema_field(schema)


def one_of(name: str, *serializers: Any) -> Any:
    """A response that is one of ``serializers`` (``oneOf`` in the schema, as component
    ``name``) when drf-spectacular is installed; else the first, which nothing reads."""
    if not spectacular_installed():
        return serializers[0]
    from drf_spectacular.utils import PolymorphicProxySerializer

    return PolymorphicProxySerializer(
        component_name=name, serializers=list(serializers), resource_type_field_name=None
    )


def auto_schema() -> Any:
    """The schema inspector for our views: drf-spectacular's, so that the project need not
    set ``DEFAULT_SCHEMA_CLASS`` for our endpoints; DRF's default otherwise."""
    if not spectacular_installed():
        from rest_framework.schemas import DefaultSchema

        return DefaultSchema()
    from drf_spectacular.openapi import AutoSchema

    return AutoSchema()


def only_delayjobs(endpoints: list[tuple[Any, ...]], **kwargs: Any) -> list[tuple[Any, ...]]:
    """drf-spectacular preprocessing hook: keep this API's endpoints, drop the project's."""
    from .callbacks import CALLBACK_VIEWS
    from .views import API_VIEWS

    ours = (*API_VIEWS, *CALLBACK_VIEWS)
    return [e for e in endpoints if getattr(e[3], "cls", None) in ours]
