"""What an answer means for the job: success, a retry (and when), or giving up; and the
line each attempt leaves in the job's history.

2xx succeeds. 5xx, the 4xx codes of ``HTTP_RETRY_STATUSES`` (408 and 429 by default) and
failures without an answer (network, timeout, TLS) are retried with the job's backoff,
or after ``Retry-After`` when the receiver sent one (bounded) and it is later: a
``Retry-After: 0`` must not turn the job's attempts into a tight loop. Any other status
(3xx: redirects are not followed, and a 304 is no success; other 4xx: retrying cannot
help) ends the job dead now.
"""

from __future__ import annotations

import dataclasses
import datetime
import email.utils
import math
import re
import time
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ..exceptions import GiveUp, Retry
from ..redact import without_userinfo

if TYPE_CHECKING:  # not at run time: the admin reads status_in() without urllib3
    from .delivery import DeliveryFailed, Response

_SECONDS = re.compile(r"[0-9]+")  # ASCII digits only: str.isdigit() takes "\xb2"
_STATUS = re.compile(r" -> ([1-5][0-9][0-9]) |-> (no answer \([a-z]+\))")
#: Characters kept of a reason phrase (or a malformed header line): the receiver's text,
#: which http.client reads up to 64 KiB, would otherwise fill every attempt's history
#: line and log line.
MAX_REASON = 200
#: Where ``delivery`` cut the receiver's text it quotes in a failure (``MAX_QUOTED``).
_CUT = re.compile(r"(.*?)(\.\.\. \([0-9]+ characters\))", re.DOTALL)
_Text = TypeVar("_Text", str, bytes)


def excerpt(body: bytes, truncated: bool) -> str:
    """The kept body as text a database stores (no NUL) and a page shows."""
    text = body.decode("utf-8", errors="replace").replace("\x00", "\ufffd")
    return text + ("..." if truncated else "")


def retry_after(value: str | None, bound: float, now: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` value (seconds or an HTTP date), at most ``bound``;
    ``None`` for anything else."""
    if not value:
        return None
    value = value.strip()
    if _SECONDS.fullmatch(value):
        # Any number of digits (RFC 9110 10.2.3), leading zeros too ("0000" is 0): twelve
        # others are past every bound already.
        digits = value.lstrip("0")
        return bound if len(digits) > 12 else min(float(digits or 0), bound)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:  # asctime (RFC 9110 5.6.7: accepted) or "-0000": GMT both
        when = when.replace(tzinfo=datetime.UTC)
    seconds = when.timestamp() - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), bound)


def without_credentials(response: Response, credentials: Sequence[str]) -> Response:
    """``response`` with each of ``credentials`` (the request's, see ``headers.credentials``)
    masked wherever the receiver echoed it: its body, reason and headers go into the job's
    history, result and error, which the admin and the API show to whoever may read jobs,
    and a destination's ``Authorization`` is in the settings so that no job row holds it."""
    if not credentials:
        return response

    def mask(text: str) -> str:
        return masked(text, credentials)

    encoded = [credential.encode() for credential in credentials]
    body = response.body
    for credential in encoded:
        body = body.replace(credential, b"***")
    if response.truncated:  # cut at the kept bytes, perhaps inside a credential
        body = _without_start(body, encoded, b"***")
    return dataclasses.replace(
        response, body=body, reason=mask(response.reason), malformed=mask(response.malformed),
        headers={name: mask(value) for name, value in response.headers.items()},
    )  # fmt: skip


def masked(text: str, credentials: Sequence[str]) -> str:
    """``text`` with each of ``credentials`` (longest first) replaced by ``***``."""
    for credential in credentials:
        text = text.replace(credential, "***")
    return text


def _without_start(body: _Text, credentials: Sequence[_Text], mask: _Text) -> _Text:
    """``body`` with the start of a credential it ends with (4 bytes or more) masked."""
    for size in range(min(max(map(len, credentials)) - 1, len(body)), 3, -1):
        if any(c.startswith(body[-size:]) for c in credentials if len(c) > size):
            return body[:-size] + mask
    return body


def line(method: str, where: str, response: Response) -> str:
    """``POST payments:/hooks -> 503 Service Unavailable in 12 ms from 10.0.0.5; body: ...``"""
    body = excerpt(response.body, response.truncated)
    malformed = ""
    if response.malformed:  # repr: the receiver's bytes, a NUL or a newline among them
        malformed = (
            f"; malformed header line: {_clipped(response.malformed)!r} "
            "(it and the headers after it were not read)"
        )
    return (
        f"{method} {where} -> {response.status} {_clipped(response.reason)} in "
        f"{response.seconds * 1000:.0f} ms from {response.address}{malformed}"
        + (f"; body: {body}" if body else "")
    )


def _clipped(text: str) -> str:
    return text[:MAX_REASON] + "..." if len(text) > MAX_REASON else text


def status_in(text: str) -> str | None:
    """What a history ``line`` says the answer was: a status code, ``no answer (...)``."""
    found = _STATUS.search(text)
    return (found.group(1) or found.group(2)) if found else None


def judge(
    method: str,
    where: str,
    response: Response,
    *,
    retry_statuses: Collection[int],
    retry_after_max: float,
    backoff: float,
) -> dict[str, Any]:
    """Return the job's result for a 2xx answer; raise ``Retry`` or ``GiveUp`` otherwise.
    ``backoff``: the job's own wait before its next attempt, the shortest a retry waits."""
    text = line(method, where, response)
    status = response.status
    if 200 <= status < 300:
        return {
            "status": status,
            "latency_ms": round(response.seconds * 1000, 1),
            "address": response.address,
            "body": excerpt(response.body, response.truncated),
            "truncated": response.truncated,
        }
    if status == 304:  # no redirect: the answer to a conditional request (If-None-Match)
        raise GiveUp(f"{text}; not a success (only 2xx are), and not retried")
    if 300 <= status < 400:
        # The receiver's URL, shown as ours are: no password, no ?token= value.
        location = without_userinfo(response.headers.get("location", "(none)"))
        raise GiveUp(f"{text}; a redirect is not followed (Location: {location[:500]})")
    if status >= 500 or status in retry_statuses:
        after = retry_after(response.headers.get("retry-after"), retry_after_max)
        # Not "retrying in": on the last attempt the job ends dead with this line.
        when = "" if after is None else f"; Retry-After: {after:g} s"
        raise Retry(text + when, after=None if after is None else max(after, backoff))
    raise GiveUp(f"{text}; not retried (only 5xx and {sorted(retry_statuses)} are)")


def failed(
    method: str, where: str, failure: DeliveryFailed, credentials: Sequence[str] = ()
) -> Retry:
    """No answer at all: retried with the job's backoff. The failure may quote what the
    receiver sent (a status line that echoes the request line): ``credentials`` masked."""
    said = masked(str(failure), credentials)
    if credentials:  # the quote was cut before the masking, perhaps inside a credential
        said = _CUT.sub(lambda cut: _without_start(cut[1], credentials, "***") + cut[2], said)
    return Retry(f"{method} {where} -> no answer ({failure.kind}): {said}")
