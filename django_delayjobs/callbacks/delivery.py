"""One HTTP exchange with urllib3, to an address the policy has already checked.

Why urllib3 (and not httpx): it has no dependencies of its own, and its connection class
takes the address to connect to apart from the name to verify: ``host`` is the checked
address, ``server_hostname`` the name sent in SNI and matched against the certificate. So
no second DNS lookup happens (DNS rebinding), and TLS is still verified against the name.
One connection per delivery, no pool, no retries and no redirects in the client: a retry
is the job's, and a 3xx is the caller's to judge.

Timeouts: ``connect`` bounds the TCP connect (and no more of ``total`` than is left) and
the TLS handshake, ``read`` each wait for data, and ``total`` the whole exchange, enforced
by a timer that shuts the socket down (a server trickling one byte at a time never trips a
read timeout). Only the first
``keep_bytes`` of the body are read; the connection is then closed and the rest discarded.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import io
import os
import re
import socket
import ssl
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import HTTPError as Urllib3Error
from urllib3.exceptions import NewConnectionError
from urllib3.exceptions import TimeoutError as Urllib3Timeout
from urllib3.response import BaseHTTPResponse

from .policy import IPAddress, Target

USER_AGENT = "django-delayjobs"
#: Characters quoted of an error's text that the receiver chose (a malformed status line,
#: which http.client reads up to 64 KiB and quotes whole): it goes into every attempt's
#: history and log line.
MAX_QUOTED = 200
#: A Content-Length: ASCII digits (str.isdigit() takes "\xb2"), fewer than a length no
#: body reaches (RFC 9110 8.6: no overflow on conversion; http.client's int() refuses
#: more than 4,300 digits, and reads the body to the close then).
_LENGTH = re.compile(r"[0-9]{1,18}")
#: A chunk's size line (RFC 9112 7.1): hex digits, then BWS before an extension, if any.
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}[ \t]*(?:;.*)?\r?\n", re.DOTALL)


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
    truncated: bool  # the body went on past keep_bytes, or was cut short
    seconds: float
    address: str
    malformed: str = ""  # the header line that ended the readable headers (no colon)


class DeliveryFailed(Exception):
    """No response: ``kind`` is ``timeout``, ``tls`` or ``network``."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """A verifying client context (certificate chain and host name), built once per
    version of ``ca_file``: loading a trust store takes milliseconds, and a bundle is a
    file that deployments rewrite in place (a mounted secret) while a worker runs."""
    version = None
    if ca_file is not None:
        with contextlib.suppress(OSError):  # then loading it fails, with its own error
            found = os.stat(ca_file)
            version = (found.st_dev, found.st_ino, found.st_mtime_ns, found.st_size)
    return _tls_context(ca_file, version)


@functools.lru_cache(maxsize=8)
def _tls_context(ca_file: str | None, version: object) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


class _HeadUnread(http.client.HTTPException):
    """The answer's head was not read whole: the connection ended before the blank line
    that ends it, or it has more lines than ``http.client`` reads."""


class _BadLength(http.client.HTTPException):
    """The answer's ``Content-Length`` frames its body and cannot be read (RFC 9112 6.3)."""


class _Lines(io.BufferedReader):
    """The answer's stream, keeping the last line read: ``http.client`` takes a close in
    the middle of the status line or the headers for their end."""

    last_line = b"\n"

    def readline(self, size: int | None = -1) -> bytes:
        self.last_line = super().readline(size)
        return self.last_line


class _FinalResponse(http.client.HTTPResponse):
    """``http.client``'s response, reading past every informational (1xx) answer to the
    final one (RFC 9110 15.2: any number may come first; ``http.client`` skips only ``100
    Continue``). ``101 Switching Protocols`` is final (we never ask to switch). A status
    outside 100-599 is not HTTP: a bad status line, like any other malformed one. An
    endless stream of 1xx answers is cut by the total time, like a trickled body. A head
    cut short (by the receiver's close or the total time) is no answer (RFC 9112 8: its
    status may not mean what it says), not an answer with the headers that came; so is a
    head of more header lines than ``http.client`` reads (99), said as such.

    A header line without a colon ends the headers for ``http.client`` (its email parser
    takes the line and all after it for a body): ``malformed`` keeps that line, so that
    the answer's outcome says why headers it sent (``Retry-After``) were not read."""

    fp: _Lines
    malformed = ""

    def __init__(self, sock: socket.socket, *args: Any, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        self.fp = _Lines(self.fp.detach())  # the same socket, read through _Lines

    def begin(self) -> None:
        try:
            super().begin()
        except http.client.HTTPException as exc:
            if type(exc) is not http.client.HTTPException:  # "got more than 100 headers"
                raise
            of = f" (status {self.status})" if isinstance(self.status, int) else ""
            raise _HeadUnread(
                f"the answer's head{of} has more than 99 header lines, more than the HTTP "
                "client reads: an answer not read whole is no answer"
            ) from None
        if not self.fp.last_line.endswith(b"\n"):  # parse_headers' last line: b"" at EOF
            raise _HeadUnread(
                "the receiver closed the connection before the end of the answer's head "
                "(its status line and headers): an incomplete answer is no answer"
            )
        unparsed = self.msg.get_payload()
        if isinstance(unparsed, str) and unparsed.strip():
            self.malformed = unparsed.splitlines()[0]
            # Said in the outcome: not again by urllib3, in a warning with a traceback and
            # the request's query unmasked (a ?token=).
            self.msg.set_payload("")
            self.msg.defects.clear()
        self._check_length()

    def _check_length(self) -> None:
        """Refuse a ``Content-Length`` that frames the body and is not one number of ASCII
        digits (RFC 9112 6.3: the answer is then discarded): http.client reads it with
        int() ("+5", "5_0"; "-1", "0x5" and 5,000 digits as no length, read to the
        close), and the first of several only. Not where the status, the method or a
        Transfer-Encoding (which overrides it) frames the body instead."""
        if (
            "transfer-encoding" in self.msg
            or self.status in (101, 204, 304)
            or self._method == "HEAD"  # type: ignore[attr-defined]  # not in typeshed
        ):
            return
        fields = self.msg.get_all("content-length") or []
        values = {value.strip(" \t") for field in fields for value in field.split(",")}
        if values and (
            not all(_LENGTH.fullmatch(value) for value in values) or len(set(map(int, values))) > 1
        ):
            given = ", ".join(fields)
            if len(given) > MAX_QUOTED:
                given = f"{given[:MAX_QUOTED]}... ({len(given)} characters)"
            raise _BadLength(
                f"the answer's Content-Length {given!r} is not one length (up to 18 digits): an "
                "answer whose length cannot be read is no answer (RFC 9112 6.3)"
            )

    def _read_next_chunk_size(self) -> int:
        # http.client reads the size with int(size, 16): "-5" (its framing then kept as
        # body), "+5", "5_0". A ValueError here is its own for a bad size: the body ends.
        size: int = super()._read_next_chunk_size()  # type: ignore[misc]
        if not _CHUNK_SIZE.fullmatch(self.fp.last_line):
            raise ValueError("a chunk size that is not hex digits")
        return size

    def _read_status(self) -> tuple[str, int, str]:
        while True:
            version, status, reason = super()._read_status()  # type: ignore[misc]
            # http.client reads the code with int() (so "+200", "0200" and "2_00" are 200)
            # from the line split as text (so "\xa0" separates): the code is 3DIGIT (RFC
            # 9112 4), after ASCII whitespace only, as bytes.split() splits.
            line = self.fp.last_line
            code = line.split(None, 2)[1:2]
            if status > 599 or not (code and len(code[0]) == 3 and code[0].isdigit()):
                raise http.client.BadStatusLine(line.decode("iso-8859-1").rstrip("\r\n"))
            if not 100 < status < 200 or status == 101:  # 100 is skipped by begin()
                return version, status, reason
            http.client.parse_headers(self.fp)  # the interim answer's headers: skipped


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
        # Not conn.sock: an answer that ends the connection (``Connection: close``, HTTP/1.0)
        # makes http.client hand the socket to the response and set conn.sock to None.
        sock = getattr(self.conn, "last_sock", None)
        if sock is not None:
            # socket.socket's own shutdown, also for an SSLSocket: it interrupts a blocked
            # read in the other thread without touching the TLS object under it.
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def cancel(self) -> None:
        self.timer.cancel()


class _Checked:
    """A connection that reads past 1xx answers, and checks the total time between the
    TCP connect and the TLS handshake: a timer that fired while the socket was being
    connected (nothing to shut down yet) must not leave the handshake bounded only by the
    connect timeout."""

    deadline: _Deadline | None = None
    #: The socket in use, kept when http.client lets go of it for the response to read.
    last_sock: socket.socket | None = None

    @property
    def sock(self) -> socket.socket | None:
        return self._sock

    @sock.setter
    def sock(self, value: socket.socket | None) -> None:
        self._sock = value
        if value is not None:  # the TCP socket, then the TLS one wrapping it
            self.last_sock = value
        if isinstance(value, ssl.SSLSocket):
            # An EOF without close_notify raises (RFC 9112 9.8): a body ended by the close
            # is whole only if TLS says so, else it is marked truncated (ssl's default
            # reads the EOF as the end: an attacker could cut the body short unseen).
            value.suppress_ragged_eofs = False  # type: ignore[attr-defined]  # not in typeshed

    def _new_conn(self) -> socket.socket:
        sock: socket.socket = super()._new_conn()  # type: ignore[misc]
        self.sock = sock  # from here the timer can shut it down ...
        if self.deadline is not None and self.deadline.fired:  # ... or it already fired
            self.sock = None
            sock.close()
            raise TimeoutError("total time used up while connecting")
        return sock


class _Connection(_Checked, HTTPConnection):
    response_class = _FinalResponse


class _TLSConnection(_Checked, HTTPSConnection):
    response_class = _FinalResponse


def _connection(target: Target, address: IPAddress, limits: Limits, left: float) -> HTTPConnection:
    # The TCP connect has no socket for the deadline's timer to shut down until it is
    # done: what is left of the total time bounds it (the lookup, or an address that did
    # not answer, may have used most of it).
    timeout = min(limits.connect, left)
    if target.scheme == "https":
        return _TLSConnection(
            str(address), target.port, timeout=timeout,
            server_hostname=target.host, ssl_context=tls_context(limits.ca_file),
        )  # fmt: skip
    return _Connection(str(address), target.port, timeout=timeout)


#: What writing to a connection the receiver has closed raises (a TLS one: an EOF, even
#: after its close_notify: the unread request makes the close a reset).
_PEER_CLOSED = (BrokenPipeError, ConnectionResetError, ssl.SSLEOFError)


def _ended(exc: BaseException) -> str | None:
    """How the receiver ended the connection, if that is what ``exc`` says."""
    if isinstance(exc, ConnectionResetError) and not isinstance(exc, http.client.HTTPException):
        return "reset"  # not RemoteDisconnected (a ConnectionResetError): a close, no answer
    return "closed" if isinstance(exc, _PEER_CLOSED) else None


def _failure(
    exc: BaseException, timed_out: bool, limits: Limits, handshake: bool = False
) -> DeliveryFailed:
    """``handshake``: the TCP connect succeeded and the TLS handshake did not finish."""
    if timed_out:
        return DeliveryFailed(f"no complete answer within {limits.total:g} s (total)", "timeout")
    if isinstance(exc, _HeadUnread | _BadLength):
        return DeliveryFailed(str(exc), "network")
    if isinstance(exc, NewConnectionError):  # before timeouts: urllib3 derives it from one
        return DeliveryFailed(f"could not connect: {exc}", "network")
    if isinstance(exc, socket.timeout | Urllib3Timeout):
        return DeliveryFailed(f"timed out: {exc}", "timeout")
    ended = _ended(exc)
    if handshake:
        # Whatever ended it (a reset is an OSError, not an SSLError), it is the receiver's
        # TLS that failed: a terminator that will not serve this name, plain HTTP on the port.
        if ended:
            what = f"the receiver {ended} the connection ({exc})"
        else:
            what = str(exc) if isinstance(exc, ssl.SSLError) else f"{type(exc).__name__}: {exc}"
        return DeliveryFailed(f"TLS failed in the handshake: {what}", "tls")
    if ended:  # before TLS errors: after the handshake, a TLS EOF is a close like a FIN
        return DeliveryFailed(
            f"the receiver {ended} the connection before answering ({type(exc).__name__}: {exc})",
            "network",
        )
    if isinstance(exc, ssl.SSLError) or "SSL" in type(exc).__name__:
        return DeliveryFailed(f"TLS failed: {exc}", "tls")
    said = str(exc)
    if len(said) > MAX_QUOTED:
        said = f"{said[:MAX_QUOTED]}... ({len(said)} characters)"
    return DeliveryFailed(f"{type(exc).__name__}: {said}", "network")


def _exchange(
    conn: HTTPConnection,
    target: Target,
    method: str,
    headers: Mapping[str, str],
    body: bytes,
    limits: Limits,
    deadline: _Deadline,
) -> tuple[int, str, dict[str, str], bytes, bool, str]:
    sent = {"Host": target.netloc, "User-Agent": USER_AGENT}
    if any(name.lower() == "user-agent" for name in headers):  # names are case-insensitive
        del sent["User-Agent"]  # the job's or the destination's replaces ours
    sent.update(headers)
    conn.timeout = limits.read  # from now on, each wait for data
    try:
        conn.request(method, target.target, body=body or None, headers=sent,
                     preload_content=False, decode_content=False)  # fmt: skip
        unsent = None
    except _PEER_CLOSED as exc:
        # A receiver may answer before it has read the whole body (413, 401) and close:
        # the rest cannot be written, but its answer has come, and it is the answer.
        unsent = exc
    try:
        response = conn.getresponse()
    except (OSError, http.client.HTTPException):
        if unsent is None:
            raise
        raise unsent from None  # no answer came: what failed is the sending
    original = response._original_response  # the _FinalResponse urllib3's wraps
    malformed = original.malformed if isinstance(original, _FinalResponse) else ""
    try:
        names: dict[str, str] = {}
        for name, value in response.headers.items():
            names.setdefault(name.lower(), value)
        kept, truncated = b"", False
        if method != "HEAD":
            kept, truncated = _body(response, limits.keep_bytes)
            truncated = truncated or deadline.fired  # a body ended by the close: cut short
    finally:
        response.close()
    reason = response.reason or ""
    return response.status, reason, names, kept[: limits.keep_bytes], truncated, malformed


def _body(response: BaseHTTPResponse, keep_bytes: int) -> tuple[bytes, bool]:
    """Read the first ``keep_bytes`` of the body; return them and whether the body was
    longer or cut short. The status and headers have come, so the answer stands whatever
    happens to its body: a reset, a broken chunk, a close before ``Content-Length`` bytes
    or the total time only mark it truncated (its bytes so far are kept)."""
    kept = bytearray()
    try:
        while len(kept) <= keep_bytes:
            chunk = response.read1(keep_bytes + 1 - len(kept), decode_content=False)
            if not chunk:
                break
            kept += chunk
    except (OSError, Urllib3Error, http.client.HTTPException):
        return bytes(kept[:keep_bytes]), True
    truncated = len(kept) > keep_bytes or bool(response.length_remaining)
    return bytes(kept[:keep_bytes]), truncated


def send(
    target: Target,
    addresses: Sequence[IPAddress],
    method: str,
    headers: Mapping[str, str],
    body: bytes,
    limits: Limits,
    *,
    started: float | None = None,
) -> Response:
    """Send one request to the first address that accepts a connection; return the answer
    (any status) or raise ``DeliveryFailed``. ``started``: when the total time began
    (``time.monotonic()``; the caller's lookup of the name counts), else now."""
    start = time.monotonic()
    since = start if started is None else started
    failure: DeliveryFailed | None = None
    for address in addresses:
        left = limits.total - (time.monotonic() - since)
        if left <= 0:
            break
        try:
            conn = _connection(target, address, limits, left)
        except OSError as exc:  # HTTP_CA_BUNDLE missing or unreadable (SSLError: not PEM)
            raise DeliveryFailed(
                f"TLS failed: HTTP_CA_BUNDLE {limits.ca_file!r} cannot be loaded: {exc}", "tls"
            ) from None
        deadline = _Deadline(conn, left)
        conn.deadline = deadline  # type: ignore[attr-defined]
        try:
            conn.connect()
            if deadline.fired:
                raise TimeoutError("total time used up while connecting")
        except (OSError, Urllib3Error) as exc:
            deadline.cancel()
            # A socket was connected (``_Checked`` keeps it): TLS is what did not finish.
            handshake = target.scheme == "https" and getattr(conn, "last_sock", None) is not None
            conn.close()
            failure = _failure(exc, deadline.fired, limits, handshake)
            continue  # the next address may answer
        try:
            status, reason, names, kept, truncated, malformed = _exchange(
                conn, target, method, headers, body, limits, deadline
            )
        except (OSError, Urllib3Error, http.client.HTTPException) as exc:
            raise _failure(exc, deadline.fired, limits) from exc
        finally:
            deadline.cancel()
            conn.close()
        return Response(status, reason, names, kept, truncated, time.monotonic() - start,
                        str(address), malformed)  # fmt: skip
    raise failure or DeliveryFailed(f"no complete answer within {limits.total:g} s", "timeout")
