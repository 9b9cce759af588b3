"""Request headers a callback may carry: legal HTTP, and no secrets in a job row.

A header that smuggles a line break could add headers or a second request (response
splitting); framing headers are the client library's; the webhook headers are ours; and
credentials belong in ``HTTP_DESTINATIONS`` (settings), never in a row that the admin,
the API and backups show.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Mapping

from ..redact import secret_name

MAX_HEADERS = 32
MAX_VALUE_LENGTH = 4096
#: The shortest header value taken for a credential: a shorter one (``X-Auth-Mode: on``)
#: is none, and masking it would mask ordinary words of an answer.
MIN_CREDENTIAL = 8
#: What separates the ``name=value`` pairs of a credential header: ``;`` (``Cookie``), ``,``.
_PAIRS = re.compile(r"[;,]")

# RFC 9110 token characters.
_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,64}")
#: What a name may hold of them: the characters every server passes on. The other tokens
#: ('_', '.', '!', '~'...) are legal HTTP, but nginx drops such a header by default
#: (``ignore_invalid_headers``), Apache leaves it out of a CGI or WSGI environ, gunicorn
#: 22+ drops a name with '_', and CGI and WSGI read '_' as '-': the receiver would not get
#: it, or would read it as another header, and nothing would say so.
_PASSED_ON = re.compile(r"[0-9A-Za-z-]+")
# Visible ASCII, space and tab: no CR, LF, NUL or other controls, nothing non-ASCII.
_VALUE = re.compile(r"[\t\x20-\x7e]*")
#: urllib3's ``SKIP_HEADER``: a value it reads as "do not send this header" (for three
#: names) and refuses with ``ValueError`` for any other, at every delivery attempt.
_SKIP = "@@@SKIP_HEADER@@@"

#: Set by the HTTP client or by the signature: a caller cannot choose them.
RESERVED = frozenset({
    "host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade",
    "te", "trailer", "expect", "proxy-connection",
    "webhook-id", "webhook-timestamp", "webhook-signature",
})  # fmt: skip
#: Sent by the delivery unless the request names them (any case): spelled with '_', a name
#: was sent beside ours, and a receiver that reads '_' as '-' took either one.
DEFAULTS = frozenset({"user-agent", "content-type", "accept-encoding"})
#: Credentials: allowed in a destination's headers (settings), refused in a job row.
SECRET = frozenset({
    "authorization", "proxy-authorization", "cookie", "x-api-key", "api-key", "x-auth-token",
})  # fmt: skip


def _key(name: str) -> str:
    """A header name as a receiver may read it: any case, and '_' as '-' (CGI and WSGI name
    both ``HTTP_X_A``; wsgiref, and gunicorn before 22, join or replace the two)."""
    return name.lower().replace("_", "-")


class InvalidHeader(ValueError):
    """A header name or value that is not legal HTTP, or not allowed here."""


def check_headers(headers: object, *, secrets_allowed: bool = False) -> dict[str, str]:
    """Return the headers as a plain dict, or raise ``TypeError``/``InvalidHeader``."""
    if not isinstance(headers, Mapping):
        raise TypeError(f"headers must be a dict of str to str, not {type(headers).__name__}")
    # Counted as read too: a mapping's len() may say fewer than its items() give, and a
    # job stored with more headers than load() takes dies at its first attempt.
    items = list(headers.items()) if len(headers) <= MAX_HEADERS else None
    if items is None or len(items) > MAX_HEADERS:
        count = len(headers) if items is None else len(items)
        raise InvalidHeader(f"at most {MAX_HEADERS} headers, not {count}")
    checked: dict[str, str] = {}
    seen: set[str] = set()
    for name, value in items:
        if not isinstance(name, str) or not isinstance(value, str):
            raise TypeError(f"header {name!r}: names and values must be str")
        # Read as the text that is stored and sent: a subclass's len(), == or lower() may
        # say otherwise, and the delivery's check of the row would refuse it.
        name, value = str.__str__(name), str.__str__(value)
        if not _NAME.fullmatch(name):
            raise InvalidHeader(f"header name {name!r} is not a legal HTTP token")
        if len(value) > MAX_VALUE_LENGTH or not _VALUE.fullmatch(value):
            raise InvalidHeader(
                f"header {name}: the value must be at most {MAX_VALUE_LENGTH} characters of "
                "visible ASCII, space or tab (no CR, LF or other control characters)"
            )
        if value == _SKIP:
            raise InvalidHeader(f"header {name}: {value!r} is the HTTP client's own marker")
        lower = _key(name)
        if lower in DEFAULTS and "_" in name:
            raise InvalidHeader(
                f"header {name}: write it {lower.title()}, which replaces the delivery's own "
                "(a receiver reads '_' as '-', and would get both)"
            )
        if lower in seen:
            raise InvalidHeader(f"header {name} is given twice")
        seen.add(lower)
        if lower in RESERVED or (lower.startswith("proxy-") and lower not in SECRET):
            raise InvalidHeader(f"header {name} is set by the delivery itself")
        if lower in SECRET and not secrets_allowed:
            raise InvalidHeader(
                f"header {name} carries a credential: put it in the headers of an "
                "HTTP_DESTINATIONS entry, so that job rows never hold it"
            )
        if not _PASSED_ON.fullmatch(name):
            raise InvalidHeader(
                f"header name {name!r}: write it {re.sub('[^0-9A-Za-z-]', '-', name)!r} "
                "(letters, digits and '-' only): nginx and Apache drop a name with other "
                "characters, gunicorn one with '_', though HTTP allows them"
            )
        checked[name] = value
    return checked


def merged(job_headers: Mapping[str, str], destination: Mapping[str, str]) -> dict[str, str]:
    """The job's headers with the destination's on top (same name, any case, '_' for '-':
    its value)."""
    overridden = {_key(name) for name in destination}
    merged = {k: v for k, v in job_headers.items() if _key(k) not in overridden}
    merged.update(destination)
    return merged


def credentials(headers: Mapping[str, str], also: Iterable[str] = ()) -> list[str]:
    """The values of the headers named as credentials (``Authorization``, ``X-Access-Token``),
    each whole, its part after a scheme (``Bearer <token>``), and the value of each of its
    ``name=value`` pairs (a ``Cookie``'s cookies, an ``AWS4-HMAC-SHA256 ...Signature=``):
    an error page shows each cookie alone; a ``Basic`` one decoded too; and ``also`` (the
    URL's ``?token=`` values). Each also as a JSON string holds it. Longest first."""
    found: set[str] = set(also)
    for name, value in headers.items():
        if _key(name) in SECRET or secret_name(name):
            found.update((value, value.rpartition(" ")[2]))
            found.update(pair.partition("=")[2].strip(' "') for pair in _PAIRS.split(value))
            found.update(_basic(value))
    # As a JSON answer quotes them: '"' and '\' escaped, and '/' too by some (PHP's
    # json_encode writes '\/'), which a base64 token often holds.
    quoted = {json.dumps(v)[1:-1] for v in found}
    found |= quoted | {v.replace("/", "\\/") for v in quoted}
    return sorted((v for v in found if len(v) >= MIN_CREDENTIAL), key=len, reverse=True)


def _basic(value: str) -> tuple[str, ...]:
    """The ``user:password`` of a ``Basic`` credential, and its password: a receiver's page
    may show them decoded (PHP's ``PHP_AUTH_PW``)."""
    scheme, _, encoded = value.strip().partition(" ")
    if scheme.lower() != "basic":
        return ()
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode()
    except ValueError:  # not base64, or not UTF-8 (binascii.Error is a ValueError)
        return ()
    return decoded, decoded.partition(":")[2]
