"""Text of a URL fit for a message: its user information (a password) masked."""

from __future__ import annotations

import re

# scheme "//" authority: the authority runs to the first "/", "?" or "#" (RFC 3986 3.2);
# its user information is everything before its last "@".
_AUTHORITY = re.compile(r"^(?P<head>(?:[A-Za-z][A-Za-z0-9+.-]*:)?//)(?P<authority>[^/?#]*)")


def without_userinfo(url: str) -> str:
    """``url`` with the user information of its authority (``user:password@``) replaced
    by ``***``, so that no message, check or log line shows a password; otherwise as is.
    Works on any text, parseable or not."""
    found = _AUTHORITY.match(url)
    if found is None or "@" not in found["authority"]:
        return url
    host = found["authority"].rpartition("@")[2]
    return f"{found['head']}***@{host}{url[found.end() :]}"
