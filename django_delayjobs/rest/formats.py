"""JSON in and out of the API, safe for hostile input and for rows the door did not check.

DRF's ``JSONParser`` lets a ``RecursionError`` through (a body nested 100,000 deep is a
500), and its ``JSONRenderer`` writes non-ASCII as it is, so a lone surrogate (in an
echoed field name, or in a row SQLite took before the door existed) cannot be encoded
and is a 500 too; its ``FormParser`` lets a ``UnicodeError`` through (a charset such as
punycode, whose codec ignores errors="replace" before Python 3.13). The views use the
project's parsers and renderers with these in place of DRF's.

A database that cannot be reached (or times out) is an ``OperationalError`` or
``InterfaceError`` that DRF does not handle either, raised before any view code when the
session's user is read, or, with ``ATOMIC_REQUESTS``, as Django opens the request's
transaction: Django's HTML 500 page. The views answer a JSON 503, as ``queues/`` answers
Redis down and ``metrics/`` the database down, and open that transaction themselves.

A body over Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (a list of 100,000 ids, say), or a
form over ``DATA_UPLOAD_MAX_NUMBER_FIELDS`` (or ``..._FILES``), is refused by Django with a
``SuspiciousOperation`` that DRF does not handle: Django's HTML "Bad Request" page. The
views answer in JSON instead, saying which limit it was.
"""

from __future__ import annotations

import codecs
import functools
import logging
from json import JSONDecoder
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.db import InterfaceError, OperationalError, connections
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.text import capfirst
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import BaseParser, FormParser, JSONParser
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.utils import json

from .. import request_transactions
from ..databases import database_named, jobs_alias


class SafeJSONParser(JSONParser):
    """DRF's JSON parser; a body nested too deep for Python's parser is a 400, and so is
    an object that gives a key twice: Python keeps the last value, a proxy or validator in
    front may have read the first (the query string's filters refuse a repeat too)."""

    def parse(self, stream: Any, media_type: str | None = None,
              parser_context: Any = None) -> Any:  # fmt: skip
        # DRF's parse(), with the hook its json.load() cannot be given
        encoding = text_encoding(parser_context or {})
        try:
            constant = json.strict_constant if self.strict else None
            return json.loads(
                codecs.getreader(encoding)(stream).read(),
                parse_constant=constant, object_pairs_hook=unique_keys,
            )  # fmt: skip
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply") from None
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None


def text_encoding(parser_context: Any) -> str:
    """The body's charset, if it is a text encoding (DRF's own parser checks it since
    3.18.2, which this one replaces): a bytes codec such as ``bz2_codec`` would
    decompress a body past the size limit."""
    encoding = str(parser_context.get("encoding") or settings.DEFAULT_CHARSET)
    try:
        "".encode(encoding)
    except (LookupError, UnicodeError):
        raise ParseError(
            f'Unsupported charset "{encoding}" in request Content-Type header.'
        ) from None
    return encoding


class UniqueKeysDecoder(JSONDecoder):
    """A JSON decoder that refuses an object giving a key twice (for a JSON field's text)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**{**kwargs, "object_pairs_hook": unique_keys})


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The JSON object of ``pairs``, each key given once."""
    seen: set[str] = set()
    for name, _ in pairs:
        if name in seen:
            shown = name if len(name) <= 50 else f"{name[:50]}..."
            raise ValueError(f"the key {shown!r} is given more than once: give it once")
        seen.add(name)
    return dict(pairs)


class SafeFormParser(FormParser):
    """DRF's form parser; a body its charset's codec cannot decode is a 400. Django decodes
    with errors="replace", which some codecs (punycode) ignore: their UnicodeError was a
    500."""

    def parse(self, stream: Any, media_type: str | None = None,
              parser_context: Any = None) -> Any:  # fmt: skip
        try:
            return super().parse(stream, media_type, parser_context)
        except UnicodeError:
            raise ParseError(
                "Form parse error - the body cannot be decoded in its charset"
            ) from None


class AsciiJSONRenderer(JSONRenderer):
    """DRF's JSON renderer with every non-ASCII character escaped (``\\ud800`` too)."""

    ensure_ascii = True


_SAFE_PARSERS: dict[type[BaseParser], type[BaseParser]] = {
    JSONParser: SafeJSONParser, FormParser: SafeFormParser,
}  # fmt: skip


def safe_parsers(parsers: list[BaseParser]) -> list[BaseParser]:
    return [_SAFE_PARSERS[type(p)]() if type(p) in _SAFE_PARSERS else p for p in parsers]


def safe_renderer_classes(classes: Any) -> list[type[BaseRenderer]]:
    return [AsciiJSONRenderer if c is JSONRenderer else c for c in classes]


class BodyTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The body is larger than the site's DATA_UPLOAD_MAX_MEMORY_SIZE allows."
    default_code = "body_too_large"


logger = logging.getLogger("django_delayjobs")


class DatabaseUnavailable(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "The database is unavailable; try again later."
    default_code = "database_unavailable"


def unavailable(exc: OperationalError | InterfaceError) -> DatabaseUnavailable:
    """The 503 for a database that cannot answer, naming the jobs' database when the
    error is its (they may live on a database of their own, down while the project's
    answers: the session's user is read from that one). The error itself is logged, never
    shown: it may name hosts and users. (Not ``database_error``'s line, which reads the
    migrations for a database that answers: work for every request of an outage.)"""
    alias = jobs_alias()
    if alias is not None and not connections[alias].errors_occurred:
        alias = None  # another database failed, or both may have
    where = database_named(alias)
    logger.warning("API request while %s is unavailable: %s", where, exc)
    return DatabaseUnavailable(f"{capfirst(where)} is unavailable; try again later.")


def _refusal(exc: Exception) -> Exception:
    """Django's refusal of a body, or a database that cannot answer, as an answer DRF
    renders (the exception itself if not)."""
    if isinstance(exc, OperationalError | InterfaceError):
        # not IntegrityError or DataError: those are bugs, and stay 500s with a traceback
        return unavailable(exc)
    if isinstance(exc, RequestDataTooBig):
        return BodyTooLarge()
    if isinstance(exc, TooManyFieldsSent):
        return ParseError("The form has more fields than DATA_UPLOAD_MAX_NUMBER_FIELDS allows.")
    if isinstance(exc, TooManyFilesSent):
        return ParseError("The form has more files than DATA_UPLOAD_MAX_NUMBER_FILES allows.")
    return exc


class SafeFormats:
    """A view mixin: the project's parsers and renderers, with the safe JSON ones, and
    Django's refusal of an oversized body, and a database that cannot answer, answered
    as DRF answers (JSON)."""

    @classmethod
    def as_view(cls, *args: Any, **kwargs: Any) -> Any:  # DRF's view, wrapped
        # With ATOMIC_REQUESTS, the request's transactions are opened (and committed) in
        # here, where a database that cannot be reached is answered in JSON, not by
        # Django's HTML 500 page before DRF runs (see request_transactions).
        view = super().as_view(*args, **kwargs)  # type: ignore[misc]
        own = request_transactions.own_choice(view)

        @functools.wraps(view)
        def run(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            try:
                with request_transactions.opened(own):
                    response: HttpResponse = view(request, *args, **kwargs)
                return response
            except (OperationalError, InterfaceError) as exc:
                refusal = unavailable(exc)
                return JsonResponse({"detail": str(refusal.detail)}, status=refusal.status_code)

        return request_transactions.outside_django(run)

    def handle_exception(self, exc: Exception) -> Response:
        response: Response = super().handle_exception(_refusal(exc))  # type: ignore[misc]
        return response

    renderer_classes: Any

    def get_parsers(self) -> list[BaseParser]:
        return safe_parsers(super().get_parsers())  # type: ignore[misc]

    def get_renderers(self) -> list[BaseRenderer]:
        # On the instance: the browsable API renders its content with the first of
        # ``view.renderer_classes``, not with get_renderers().
        self.renderer_classes = safe_renderer_classes(self.renderer_classes)
        renderers: list[BaseRenderer] = super().get_renderers()  # type: ignore[misc]
        return renderers
