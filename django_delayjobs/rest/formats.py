"""JSON in and out of the API, safe for hostile input and for rows the door did not check.

DRF's ``JSONParser`` lets a ``RecursionError`` through (a body nested 100,000 deep is a
500), and its ``JSONRenderer`` writes non-ASCII as it is, so a lone surrogate (in an
echoed field name, or in a row SQLite took before the door existed) cannot be encoded
and is a 500 too. The views use the project's parsers and renderers with these two in
place of DRF's JSON ones.
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser, JSONParser
from rest_framework.renderers import BaseRenderer, JSONRenderer


class SafeJSONParser(JSONParser):
    """DRF's JSON parser; a body nested too deep for Python's parser is a 400."""

    def parse(self, stream: Any, media_type: str | None = None,
              parser_context: Any = None) -> Any:  # fmt: skip
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply") from None


class AsciiJSONRenderer(JSONRenderer):
    """DRF's JSON renderer with every non-ASCII character escaped (``\\ud800`` too)."""

    ensure_ascii = True


def safe_parsers(parsers: list[BaseParser]) -> list[BaseParser]:
    return [SafeJSONParser() if type(p) is JSONParser else p for p in parsers]


def safe_renderer_classes(classes: Any) -> list[type[BaseRenderer]]:
    return [AsciiJSONRenderer if c is JSONRenderer else c for c in classes]


class SafeFormats:
    """A view mixin: the project's parsers and renderers, with the safe JSON ones."""

    renderer_classes: Any

    def get_parsers(self) -> list[BaseParser]:
        return safe_parsers(super().get_parsers())  # type: ignore[misc]

    def get_renderers(self) -> list[BaseRenderer]:
        # On the instance: the browsable API renders its content with the first of
        # ``view.renderer_classes``, not with get_renderers().
        self.renderer_classes = safe_renderer_classes(self.renderer_classes)
        renderers: list[BaseRenderer] = super().get_renderers()  # type: ignore[misc]
        return renderers
