"""Standard Webhooks signatures (https://www.standardwebhooks.com), both sides.

Plain Python with no Django import: a receiver in any Python program can
``from django_delayjobs.callbacks.signing import verify``.

A secret is ``whsec_`` + base64 of 24 to 64 random bytes. A request carries
``webhook-id`` (the job id: the same on every retry, so it is the receiver's idempotency
key), ``webhook-timestamp`` (Unix seconds of this attempt) and ``webhook-signature``
(``v1,`` + base64 of HMAC-SHA256 over ``id.timestamp.body``; one per secret,
space-separated, so that a receiver holding any of the secrets verifies it). The HMAC is
the standard library's; the reference library (``standardwebhooks``) is used by the test
suite to check both directions.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence

PREFIX = "whsec_"
#: Seconds a receiver accepts between a request's timestamp and its own clock.
DEFAULT_TOLERANCE = 300
#: Signatures looked at in one header, and so the most secrets a sender signs with (one
#: rotating secrets signs with two or three).
MAX_SIGNATURES = 16

_ID = re.compile(r"[\x21-\x7e]{1,256}")
_TIMESTAMP = re.compile(r"[0-9]{1,12}")


class InvalidSecret(ValueError):
    """A signing secret that is not ``whsec_`` + base64 of 24 to 64 bytes."""


class InvalidSignature(Exception):
    """A request whose webhook headers are missing, malformed, too old or do not match."""


def secret_key(secret: object) -> bytes:
    """Return the key bytes of a ``whsec_...`` secret, or raise ``InvalidSecret``."""
    if not isinstance(secret, str) or not secret.startswith(PREFIX):
        raise InvalidSecret("a signing secret must be a str starting with 'whsec_'")
    encoded = secret[len(PREFIX) :]
    try:
        # Padding is optional: some senders print secrets without it.
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidSecret("a signing secret must be 'whsec_' followed by base64") from None
    if not 24 <= len(key) <= 64:
        raise InvalidSecret(f"a signing secret must hold 24 to 64 bytes, not {len(key)}")
    return key


def require_list(secrets: object) -> None:
    """Raise ``TypeError`` for one secret given where a list of them is taken: a str is a
    sequence of str, and each of its characters would be read as a secret."""
    if isinstance(secrets, str | bytes):
        raise TypeError("secrets must be a list of 'whsec_...' secrets, not one str: [secret]")


def new_secret() -> str:
    """Return a fresh random secret (32 bytes) in the ``whsec_`` form."""
    return PREFIX + base64.b64encode(os.urandom(32)).decode()


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """Return ``v1,<base64 HMAC-SHA256 of id.timestamp.body>``."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def sign(
    msg_id: str, body: bytes, secrets: Sequence[str], timestamp: int | None = None
) -> dict[str, str]:
    """Return the three webhook headers. Every secret signs (at most ``MAX_SIGNATURES``,
    which is all a receiver looks at: ``InvalidSecret`` for more), its signature
    space-separated from the others, so a receiver that holds any one of them verifies
    the request while secrets are rotated. No secret: no signature."""
    require_list(secrets)
    if len(secrets) > MAX_SIGNATURES:
        raise InvalidSecret(f"at most {MAX_SIGNATURES} signing secrets, not {len(secrets)}")
    when = int(time.time()) if timestamp is None else timestamp
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(when)}
    if secrets:
        headers["webhook-signature"] = " ".join(
            signature(secret, msg_id, when, body) for secret in secrets
        )
    return headers


def _header(headers: Mapping[str, str], name: str) -> str:
    for key, value in headers.items():
        if isinstance(key, str) and key.lower() == name:
            if not isinstance(value, str):
                break
            return value
    raise InvalidSignature(f"the {name} header is missing")


def _signatures(header: str) -> Iterable[bytes]:
    for item in header.split(" ")[:MAX_SIGNATURES]:
        version, _, encoded = item.partition(",")
        if version != "v1":
            continue
        try:
            yield base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            continue


def verify(
    headers: Mapping[str, str],
    body: bytes,
    secrets: Sequence[str],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    now: float | None = None,
) -> str:
    """Check a request's webhook headers against its raw body; return its ``webhook-id``.

    ``headers`` is any mapping of header names (any case) to values; ``secrets`` are
    ``whsec_...`` secrets, any of which may have signed. Raise ``InvalidSignature`` saying
    what is wrong; nothing else is raised for any header value.
    """
    require_list(secrets)
    if not secrets:
        raise InvalidSignature("no secret to verify with")
    keys = [secret_key(secret) for secret in secrets]  # a bad secret is the caller's bug
    msg_id = _header(headers, "webhook-id")
    stamp = _header(headers, "webhook-timestamp")
    given = _header(headers, "webhook-signature")
    if not _ID.fullmatch(msg_id):
        raise InvalidSignature("the webhook-id header is not 1 to 256 visible characters")
    if not _TIMESTAMP.fullmatch(stamp):
        raise InvalidSignature("the webhook-timestamp header is not Unix seconds")
    skew = (time.time() if now is None else now) - int(stamp)
    # Not "abs(skew) > tolerance": a NaN (tolerance or now) makes every comparison false,
    # and that test would then accept a timestamp of any age, a replay of any request.
    if not abs(skew) <= tolerance:
        direction = "old" if skew > 0 else "far in the future"
        raise InvalidSignature(
            f"the webhook-timestamp is too {direction} ({skew:+.0f} s; tolerance {tolerance:g} s)"
        )
    signed = f"{msg_id}.{stamp}.".encode() + body
    expected = [hmac.new(key, signed, hashlib.sha256).digest() for key in keys]
    for candidate in _signatures(given):
        if any(hmac.compare_digest(candidate, digest) for digest in expected):
            return msg_id
    raise InvalidSignature("no webhook-signature matches the body with any secret")
