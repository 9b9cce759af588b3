"""One HTTP exchange with urllib3, to an address the policy has already checked.

Why urllib3 (and not httpx): it has no dependencies of its own, and its connection class
takes the address to connect to apart from the name to verify: ``host`` is the checked
address, ``server_hostname`` the name sent in SNI and matched against the certificate. So
no second DNS lookup happens (DNS rebinding), and TLS is still verified against the name.
One connection per delivery, no pool, no retries and no redirects in the client: a retry
is the job's, and a 3xx is the caller's to judge.

Timeouts: ``connect`` bounds the TCP connect and the TLS handshake, ``read`` each wait for
data, and ``total`` the whole exchange, enforced by a timer that shuts the socket down (a
server trickling one byte at a time never trips a read timeout). Only the first
``keep_bytes`` of the body are read; the connection is then closed and the rest discarded.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import socket
import ssl
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import HTTPError as Urllib3Error
from urllib3.exceptions import NewConnectionError
from urllib3.exceptions import TimeoutError as Urllib3Timeout

from .policy import IPAddress, Target

USER_AGENT = "django-delayjobs"


@dataclass(frozen=True)
class Limits:
    connect: float
    read: float
    total: float
    keep_bytes: int
    ca_file: str | None = None


@dataclass(frozen=True)
class Response:
    status: int
    reason: str
    headers: Mapping[str, str]  # lower-case names; the first value of each
    body: bytes  # at most keep_bytes
    truncated: bool  # the body went on past keep_bytes
    seconds: float
    address: str


class DeliveryFailed(Exception):
    """No response: ``kind`` is ``timeout``, ``tls`` or ``network``."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


@functools.lru_cache(maxsize=8)
def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """A verifying client context (certificate chain and host name), built once: loading
    the system's trust store takes milliseconds."""
    context = ssl.create_default_context(cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


class _Deadline:
    """Shuts the connection's socket down when the total time is up."""

    def __init__(self, conn: HTTPConnection, seconds: float) -> None:
        self.conn = conn
        self.fired = False
        self.timer = threading.Timer(max(seconds, 0.0), self._fire)
        self.timer.daemon = True
        self.timer.start()

    def _fire(self) -> None:
        self.fired = True
        sock = self.conn.sock
        if sock is not None:
            # socket.socket's own shutdown, also for an SSLSocket: it interrupts a blocked
            # read in the other thread without touching the TLS object under it.
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def cancel(self) -> None:
        self.timer.cancel()


def _connection(target: Target, address: IPAddress, limits: Limits) -> HTTPConnection:
    timeout = min(limits.connect, limits.total)
    if target.scheme == "https":
        return HTTPSConnection(
            str(address), target.port, timeout=timeout,
            server_hostname=target.host, ssl_context=tls_context(limits.ca_file),
        )  # fmt: skip
    return HTTPConnection(str(address), target.port, timeout=timeout)


def _failure(exc: BaseException, timed_out: bool, limits: Limits) -> DeliveryFailed:
    if timed_out:
        return DeliveryFailed(f"no complete answer within {limits.total:g} s (total)", "timeout")
    if isinstance(exc, NewConnectionError):  # before timeouts: urllib3 derives it from one
        return DeliveryFailed(f"could not connect: {exc}", "network")
    if isinstance(exc, socket.timeout | Urllib3Timeout):
        return DeliveryFailed(f"timed out: {exc}", "timeout")
    if isinstance(exc, ssl.SSLError) or "SSL" in type(exc).__name__:
        return DeliveryFailed(f"TLS failed: {exc}", "tls")
    return DeliveryFailed(f"{type(exc).__name__}: {exc}", "network")


def _exchange(
    conn: HTTPConnection,
    target: Target,
    method: str,
    headers: Mapping[str, str],
    body: bytes,
    limits: Limits,
    deadline: _Deadline,
) -> tuple[int, str, dict[str, str], bytes, bool]:
    sent = {"Host": target.netloc, "User-Agent": USER_AGENT, **headers}
    conn.timeout = limits.read  # from now on, each wait for data
    conn.request(method, target.target, body=body or None, headers=sent,
                 preload_content=False, decode_content=False)  # fmt: skip
    response = conn.getresponse()
    try:
        if deadline.fired:  # the status line or the headers were cut short
            raise TimeoutError("total time used up while reading the headers")
        names: dict[str, str] = {}
        for name, value in response.headers.items():
            names.setdefault(name.lower(), value)
        kept, truncated = b"", False
        if method != "HEAD":
            try:
                kept = response.read(limits.keep_bytes + 1, decode_content=False)
            except (OSError, Urllib3Error, http.client.HTTPException):
                if not deadline.fired:
                    raise
                truncated = True  # the answer came; only its body was cut short by the total
            truncated = truncated or len(kept) > limits.keep_bytes
    finally:
        response.close()
    return response.status, response.reason or "", names, kept[: limits.keep_bytes], truncated


def send(
    target: Target,
    addresses: Sequence[IPAddress],
    method: str,
    headers: Mapping[str, str],
    body: bytes,
    limits: Limits,
) -> Response:
    """Send one request to the first address that accepts a connection; return the answer
    (any status) or raise ``DeliveryFailed``."""
    start = time.monotonic()
    failure: DeliveryFailed | None = None
    for address in addresses:
        left = limits.total - (time.monotonic() - start)
        if left <= 0:
            break
        conn = _connection(target, address, limits)
        deadline = _Deadline(conn, left)
        try:
            conn.connect()
            if deadline.fired:
                raise TimeoutError("total time used up while connecting")
        except (OSError, Urllib3Error) as exc:
            deadline.cancel()
            conn.close()
            failure = _failure(exc, deadline.fired, limits)
            continue  # the next address may answer
        try:
            status, reason, names, kept, truncated = _exchange(
                conn, target, method, headers, body, limits, deadline
            )
        except (OSError, Urllib3Error, http.client.HTTPException) as exc:
            raise _failure(exc, deadline.fired, limits) from exc
        finally:
            deadline.cancel()
            conn.close()
        return Response(status, reason, names, kept, truncated, time.monotonic() - start,
                        str(address))  # fmt: skip
    raise failure or DeliveryFailed(f"no complete answer within {limits.total:g} s", "timeout")
