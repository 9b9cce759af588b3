"""The request a callback job stores: method, URL or destination + path, headers, body.

``build`` validates what ``schedule_http`` is given and returns the ``CallbackRequest``
whose ``stored()`` form goes into the job's kwargs; ``load`` reads such kwargs back and
validates them again, since a row may have been written by anything (an older version, a
manual edit). The body is stored as the exact text to send, so the signature covers the
same bytes on every retry.
"""

from __future__ import annotations

import json as jsonlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from django.core.serializers.json import DjangoJSONEncoder

from ..exceptions import InvalidSchedule
from ..redact import secret_name, without_userinfo
from ..serialization import TZINFO_ERRORS
from .config import Destination, HttpConfig
from .headers import MAX_HEADERS, InvalidHeader, check_headers, merged
from .policy import MAX_URL_LENGTH, Target, addresses, check_host, parse_url

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
_NO_BODY = frozenset({"GET", "HEAD"})
_DESTINATION_URL = re.compile(r"([a-z][a-z0-9_-]{0,63}):(/.*)", re.DOTALL)
_PATH = re.compile(r"/[\x21-\x5b\x5d-\x7e]*")  # visible ASCII but the backslash
_DOT_SEGMENT = re.compile(r"(?:\.|%2e){1,2}", re.IGNORECASE)
# Where a segment ends for some receiver: a slash, or one percent-encoded (a server that
# decodes it first), or a backslash so encoded (WHATWG and IIS read a backslash as '/').
_SEPARATOR = re.compile(r"/|%2f|%5c", re.IGNORECASE)
# Where a segment's path parameters start (RFC 3986 3.3): Tomcat, Jetty and Spring drop
# them before resolving dot segments, so '..;x' (or '..%3bx') is a '..' segment to them.
_PARAMETERS = re.compile(r";|%3b", re.IGNORECASE)


class InvalidCallback(InvalidSchedule):
    """A callback request that cannot be stored or sent; ``field`` names the bad part."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class CallbackRequest:
    method: str
    url: str | None = None  # an absolute http(s) URL ...
    destination: str | None = None  # ... or the name of an HTTP_DESTINATIONS entry
    path: str | None = None  # with the path (and query) to append to its URL
    headers: Mapping[str, str] = field(default_factory=dict)
    body: str | None = None

    def stored(self) -> dict[str, Any]:
        """The job's kwargs (only what is set)."""
        values = {
            "method": self.method,
            "url": self.url,
            "destination": self.destination,
            "path": self.path,
            "headers": dict(self.headers) or None,
            "body": self.body,
        }
        return {name: value for name, value in values.items() if value is not None}

    @property
    def where(self) -> str:
        """The URL, or ``destination:path`` for a named destination (what the admin shows,
        and the history and the worker's log lines write), a ``?token=`` in it masked."""
        if self.url is not None:
            return without_userinfo(self.url)
        path = self.path if self.path is None else without_userinfo(self.path)
        return f"{self.destination}:{path}"

    def body_bytes(self) -> bytes:
        return b"" if self.body is None else self.body.encode()

    def target(self, config: HttpConfig) -> tuple[Target, Destination | None]:
        """Where to send it under ``config``: raise ``Refused`` or ``InvalidCallback``."""
        if self.url is not None:
            target, destination = parse_url(self.url), None
        else:
            destination = config.destinations.get(self.destination or "")
            if destination is None:
                raise InvalidCallback(
                    f"no destination {self.destination!r} in HTTP_DESTINATIONS", "url"
                )
            target = destination.target(self.path or "/")
        check_host(target, config.allowed)
        return target, destination

    def send_headers(self, destination: Destination | None) -> dict[str, str]:
        return merged(self.headers, destination.headers if destination else {})


def masked(stored: Mapping[str, Any]) -> dict[str, Any]:
    """Stored kwargs as they are shown (the admin, the API, an error quoting a row): the
    ``url`` (or a destination's ``path``) with user information and credential query values
    masked (``?token=***``), as ``where`` shows it, and the values of headers whose name
    says they hold a credential (``X-Access-Token``) too."""
    shown = dict(stored)
    for name in ("url", "path"):
        if isinstance(shown.get(name), str):
            shown[name] = without_userinfo(shown[name])
    if isinstance(shown.get("headers"), Mapping):
        shown["headers"] = {
            name: "***" if isinstance(name, str) and secret_name(name) else value
            for name, value in shown["headers"].items()
        }
    return shown


# -- building -------------------------------------------------------------------------------


def _check_path(path: str) -> str:
    shown = without_userinfo(path)  # quoted as a URL is: no ?token= value
    if len(path) > MAX_URL_LENGTH or not _PATH.fullmatch(path) or "#" in path:
        raise InvalidCallback(
            f"the path {shown!r} must start with '/' and hold visible ASCII only (no '#' or "
            "backslash; percent-encode the rest)",
            "url",
        )
    segments = _SEPARATOR.split(path.partition("?")[0])
    bare = (_PARAMETERS.split(segment, 1)[0] for segment in segments)
    if path.startswith("//") or any(_DOT_SEGMENT.fullmatch(s) for s in bare):
        raise InvalidCallback(
            f"the path {shown!r} must not start with '//' or hold '.' or '..' segments (path "
            "parameters such as '..;x' included): it "
            "stays under its destination's URL",
            "url",
        )
    return path


def destination_named(url: str) -> tuple[str, str] | None:
    """The (destination, path) of a ``destination:/path`` URL, else None (``scheme://host``
    is a URL, of a scheme we may not send to)."""
    named = _DESTINATION_URL.fullmatch(url)
    if named is None or named.group(1) in ("http", "https") or named.group(2).startswith("//"):
        return None
    return named.group(1), named.group(2)


def split_url(url: object, config: HttpConfig | None) -> CallbackRequest:
    """Return a request with the URL part set: an absolute URL or ``destination:/path``."""
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, not {type(url).__name__}")
    url = str.__str__(url)  # its text, as stored: a subclass's len() may say otherwise
    named = destination_named(url)
    if named:
        name, path = named
        if config is not None and name not in config.destinations:
            known = ", ".join(sorted(config.destinations)) or "none are configured"
            shown = without_userinfo(url)  # a ?token= of the path
            raise InvalidCallback(
                f"{shown!r} names no destination of HTTP_DESTINATIONS (known: {known})", "url"
            )
        return CallbackRequest("POST", destination=name, path=_check_path(path))
    parse_url(url)  # raises Refused for anything that is not an absolute http(s) URL
    return CallbackRequest("POST", url=url)


def check_method(method: object) -> str:
    """``method`` in upper case if it is one of ``METHODS`` in any case (``schedule_http``
    and ``POST callbacks/`` both ask here), else raise ``InvalidCallback``. ASCII only:
    ``str.upper()`` makes ``"POST"`` of ``"po\\u017ft"`` (a long s)."""
    if isinstance(method, str) and method.isascii() and method.upper() in METHODS:
        return method.upper()
    shown = repr(method)
    if isinstance(method, str) and len(method) > 20:  # a 10k method is not echoed whole
        shown = f"{method[:20]!r}... ({len(method)} characters)"
    raise InvalidCallback(f"method must be one of {', '.join(METHODS)}, not {shown}", "method")


def _body(method: str, json: Any, data: Any) -> tuple[str | None, str | None]:
    """Return (body text, default Content-Type)."""
    if json is not None and data is not None:
        raise InvalidCallback("pass json= or data=, not both", "json")
    if (json is not None or data is not None) and method in _NO_BODY:
        raise InvalidCallback(f"a {method} request has no body", "method")
    if json is not None:
        try:
            text = jsonlib.dumps(json, cls=DjangoJSONEncoder, ensure_ascii=False,
                                 allow_nan=False, separators=(",", ":"))  # fmt: skip
        except TZINFO_ERRORS as exc:  # a datetime's tzinfo that gives no offset, too
            raise InvalidCallback(f"json= is not JSON: {exc}", "json") from None
        except RecursionError:
            raise InvalidCallback("json= is nested too deeply", "json") from None
        return text, "application/json"
    if data is None:
        return None, None
    if isinstance(data, bytes):
        try:
            data = data.decode()
        except UnicodeDecodeError:
            raise InvalidCallback("data= bytes must be UTF-8 text", "data") from None
    if isinstance(data, Mapping):
        pairs = list(data.items())
        if not all(isinstance(k, str) and isinstance(v, str | int | float) for k, v in pairs):
            raise TypeError("data= as a dict must map str to str or numbers (a form)")
        try:
            form = urlencode([(str.__str__(k), _form_value(v)) for k, v in pairs])
            return form, "application/x-www-form-urlencoded"
        except UnicodeEncodeError:  # urlencode writes the form's text as UTF-8
            raise InvalidCallback("the form holds a lone surrogate: not UTF-8", "data") from None
        except ValueError as exc:  # an int of more digits than int.__str__ writes
            raise InvalidCallback(f"the form cannot be written: {exc}", "data") from None
    if isinstance(data, str):
        return data, "text/plain; charset=utf-8"
    raise TypeError(f"data= must be str, bytes or a dict, not {type(data).__name__}")


def _form_value(value: str | int | float) -> str | int | float:
    """A form's value as its base type's value (a key: its text, ``str.__str__``):
    ``urlencode`` writes ``str()`` of each, which for a member of ``class Kind(str, Enum)``
    is ``Kind.REFUND``, not the ``refund`` that ``json=`` sends. A bool stays one (sent
    as ``True``)."""
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return value
    return int.__int__(value) if isinstance(value, int) else float.__float__(value)


def _check_text(text: str, max_bytes: int, field: str = "data") -> None:
    """``field``: the argument the body came from (``json`` or ``data``), for the 400."""
    if "\x00" in text:
        raise InvalidCallback("the body holds a NUL character", field)
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        raise InvalidCallback("the body holds a lone surrogate: not UTF-8", field) from None
    if size > max_bytes:
        raise InvalidCallback(
            f"the body is {size} bytes; HTTP_MAX_REQUEST_BYTES allows {max_bytes}", field
        )


def build(
    url: object,
    *,
    method: object,
    json: Any,
    data: Any,
    headers: object,
    config: HttpConfig,
    max_bytes: int,
) -> CallbackRequest:
    """Validate ``schedule_http``'s request arguments; return what the job stores."""
    method = check_method(method)
    request = split_url(url, config)
    target, _ = request.target(config)  # the URL's form and the allowlist
    if target.address is not None:  # an address in the URL; a name is resolved at delivery
        addresses(target, config.allow_private)  # only: the caller's transaction may be open
    try:
        checked = check_headers({} if headers is None else headers)
    except InvalidHeader as exc:
        raise InvalidCallback(str(exc), "headers") from None
    body, content_type = _body(method, json, data)
    if body is not None:
        _check_text(body, max_bytes, "data" if json is None else "json")
        if content_type and not any(name.lower() == "content-type" for name in checked):
            if len(checked) == MAX_HEADERS:  # stored, the job could never be sent (load)
                raise InvalidCallback(
                    f"at most {MAX_HEADERS} headers, with the Content-Type the body adds",
                    "headers",
                )
            checked["Content-Type"] = content_type
    return CallbackRequest(method, request.url, request.destination, request.path, checked, body)


def load(stored: Mapping[str, Any]) -> CallbackRequest:
    """Read a job's kwargs back into a request, validating them again: anything malformed,
    values of the wrong JSON type included, raises ``InvalidCallback``."""
    try:
        return _load(stored)
    except TypeError as exc:
        raise InvalidCallback(f"the stored request is malformed: {exc}", "url") from None


def _load(stored: Mapping[str, Any]) -> CallbackRequest:
    unknown = set(stored) - {"method", "url", "destination", "path", "headers", "body"}
    method, body = stored.get("method"), stored.get("body")
    if unknown or method not in METHODS or not isinstance(body, str | None):
        raise InvalidCallback(f"the stored request is malformed: {masked(stored)!r:.200}", "url")
    if (stored.get("url") is None) == (stored.get("destination") is None):
        raise InvalidCallback("the stored request has no URL or destination", "url")
    if stored.get("url") is not None:
        request = split_url(stored["url"], None)
        if request.url is None:
            raise InvalidCallback("the stored URL is not absolute", "url")
    else:
        name, path = stored.get("destination"), stored.get("path")
        request = split_url(f"{name}:{path}", None)
        if request.destination != name:
            raise InvalidCallback("the stored destination is malformed", "url")
    try:
        checked = check_headers(stored.get("headers") or {})
    except InvalidHeader as exc:
        raise InvalidCallback(str(exc), "headers") from None
    if body is not None:
        _check_text(body, len(body.encode(errors="replace")))
    return CallbackRequest(method, request.url, request.destination, request.path, checked, body)
