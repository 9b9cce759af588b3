"""Text of a URL fit for a message: its user information and secret query values masked."""

from __future__ import annotations

import re
from urllib.parse import unquote_plus, urlsplit

# [scheme "://"] authority: the authority runs to the first "/", "?" or "#" (RFC 3986 3.2);
# its user information is everything before its last "@".
_AUTHORITY = re.compile(r"^(?P<head>(?:[A-Za-z][A-Za-z0-9+.-]*:)?//)?(?P<authority>[^/?#]*)")
# A query (or fragment) parameter: its separator, name and value. Its name is read as
# redis-py and web frameworks read it, percent-decoded ("pass%77ord" is "password"), and it
# is secret when any part of it names a credential (client_secret, x-api-key...).
_PARAMETER = re.compile(r"(?P<head>[?&;#](?P<name>[^=?&;#]*)=)[^&;#]*")
_SECRET_NAME = re.compile(r"(?i)pass|pwd|secret|token|key|auth|sig|cred|session|jwt|bearer")


def secret_name(name: str) -> bool:
    """True if ``name`` (a query parameter's, a header's) says its value is a credential."""
    return _SECRET_NAME.search(name) is not None


def _mask_parameter(found: re.Match[str]) -> str:
    secret = secret_name(unquote_plus(found["name"]))
    return f"{found['head']}***" if secret else found[0]


def secret_values(url: str) -> list[str]:
    """The values ``without_userinfo`` masks in the query (and fragment) of ``url``, each
    as written and percent-decoded: a receiver that quotes the URL may show either."""
    found = []
    for parameter in _PARAMETER.finditer(url):
        if secret_name(unquote_plus(parameter["name"])):
            value = parameter[0][len(parameter["head"]) :]
            found += [value, unquote_plus(value)]
    return found


def without_userinfo(url: str) -> str:
    """``url`` with the user information of its authority (``user:password@``) replaced
    by ``***``, and the values of query (and fragment) parameters whose name, decoded,
    holds a credential's (``?password=``, ``?pass%77ord=``, ``?client_secret=``...) too,
    so that no message, check or log line shows a password. Works on any text, parseable
    or not: a password holding an unencoded ``/``, ``?`` or ``#`` (which ends the
    authority early) is masked up to the last ``@``."""
    shown = _PARAMETER.sub(_mask_parameter, url)
    found = _AUTHORITY.match(shown)
    assert found is not None  # every part may be empty
    authority = found["authority"]
    if "@" in authority:
        end = found.start("authority") + authority.rindex("@")
    elif "@" in shown[found.end() :] and _looks_like_userinfo(authority):
        end = shown.rindex("@")  # "u:pa/ss@host": a malformed password, masked whole
    else:
        return shown
    return f"{shown[: found.start('authority')]}***{shown[end:]}"


def _looks_like_userinfo(authority: str) -> bool:
    """True if ``authority`` (it holds no "@") reads as the start of ``user:password``:
    a colon followed by something other than a port number (or an IPv6 host's colons)."""
    _, colon, port = authority.rpartition(":")
    return bool(colon) and not port.isdigit() and not authority.endswith("]")


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be split (or its port read), in words that show no secret;
    None if it can. ``urlsplit``'s own message quotes the port's text, which for a
    password holding a "/" is part of that password."""
    try:
        urlsplit(url).port  # noqa: B018 -- a port that is not a number raises ValueError
        return None
    except ValueError:
        pass
    try:
        urlsplit(without_userinfo(url)).port  # noqa: B018
    except ValueError as exc:
        return str(exc)
    return "its user information holds a '/', '?', '#' or '@': percent-encode them"
