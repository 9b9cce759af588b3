"""``run_delayworker --metrics-port``: the same deployment-wide metrics as the ``metrics/``
view, from the worker process, for deployments that do not expose the web app to
Prometheus. ``METRICS_TOKEN``, when set, is required here too.

Each scrape runs in its own short thread (``ThreadingMixIn``); it closes the database
connection it opened, so scrapes leave no connection behind. They read one at a time (the
worker's Redis pool is counted one connection for them). At most ``MAX_CONNECTIONS``
are served at a time, and a client has ``REQUEST_TIMEOUT_SECONDS`` to send its request: a
client that sends nothing must not hold the worker's threads and file descriptors.
"""

from __future__ import annotations

import errno
import io
import ipaddress
import logging
import math
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from django.db import DatabaseError, connections

from ..conf import delayjobs_settings
from ..connection import get_engine
from ..engine import EngineUnavailable
from . import access, snapshot

logger = logging.getLogger("django_delayjobs.metrics")

StartResponse = Callable[..., Any]

#: Seconds a client may take to send its request (and to read the answer) before its
#: connection is dropped: one that sends nothing would otherwise hold a thread and a file
#: descriptor of the worker process for ever.
REQUEST_TIMEOUT_SECONDS = 10.0
#: Connections served at once; more are closed as soon as they are accepted, rather than
#: each taking a thread and a file descriptor the worker needs for its own connections.
MAX_CONNECTIONS = 8
#: The pause after a connection could not be accepted for want of file descriptors.
ACCEPT_PAUSE_SECONDS = 0.1
#: Scrapes read Redis (and the database) one at a time: the worker's pool check counts one
#: connection for this port (``preflight.check_pool``), and each reading scrape holds one.
_READING = threading.Lock()


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.refused_at = -math.inf  # when a refusal was last logged (one a minute)
        self.failed_at = -math.inf  # when a failed accept was last logged (one a minute)
        super().__init__(*args, **kwargs)

    def get_request(self) -> Any:
        """Accept a connection. One that cannot be (the process is out of file descriptors)
        stays pending, so the listening socket is ready again at once: without a pause the
        thread spun at a full core, holding the GIL the worker's threads need."""
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                if time.monotonic() - self.failed_at >= 60:
                    self.failed_at = time.monotonic()
                    logger.warning("metrics: cannot accept a connection (%s)", exc)
                time.sleep(ACCEPT_PAUSE_SECONDS)
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            if time.monotonic() - self.refused_at >= 60:
                self.refused_at = time.monotonic()
                logger.warning("metrics: %s connections at once already; closing more (from "
                               "%s...)", MAX_CONNECTIONS, client_address[0])  # fmt: skip
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started ("can't start new thread")
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out or went away is no error of ours (socketserver printed a
        traceback to stderr for each); anything else is logged."""
        if not isinstance(sys.exc_info()[1], OSError):
            logger.error("metrics: a request from %s failed", client_address[0], exc_info=True)


class _Server6(_Server):
    address_family = socket.AF_INET6


def _ipv6(host: str) -> bool:
    """Whether ``host`` is an IPv6 address (``::1``, or ``[::1]`` as in a URL)."""
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address)
    except ValueError:
        return False


class _Deadline(io.RawIOBase):
    """The request's socket, read until a deadline: a timeout per read alone would let a
    client that sends a byte now and then hold its connection for as long as it likes."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        self.sock = sock
        self.deadline = time.monotonic() + seconds

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the client did not send its request in time")
        self.sock.settimeout(left)  # sending the answer then gets as long as is left now
        return self.sock.recv_into(buffer)


class _QuietHandler(WSGIRequestHandler):
    def setup(self) -> None:
        super().setup()
        # Read when it runs: tests shorten it.
        self.connection.settimeout(REQUEST_TIMEOUT_SECONDS)
        self.rfile.close()  # the socket's own reader: the socket stays open
        self.rfile = io.BufferedReader(_Deadline(self.connection, REQUEST_TIMEOUT_SECONDS))

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds would flood the worker's log."""


def _plain(start: StartResponse, status: str, body: str, *extra: tuple[str, str]) -> list[bytes]:
    start(status, [("Content-Type", "text/plain; charset=utf-8"),
                   ("Cache-Control", "no-store"), *extra])  # fmt: skip
    return [body.encode() + b"\n"]


def app(environ: dict[str, Any], start: StartResponse) -> Iterable[bytes]:
    """The WSGI application: GET/HEAD ``/metrics`` (or ``/``) with the token, if one is set."""
    from . import exposition

    if environ.get("PATH_INFO", "/") not in ("/", "/metrics"):
        return _plain(start, "404 Not Found", "not found: scrape /metrics")
    if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
        return _plain(start, "405 Method Not Allowed", "GET only", ("Allow", "GET, HEAD"))
    if delayjobs_settings.METRICS_TOKEN is not None:
        given = access.bearer(environ.get("HTTP_AUTHORIZATION"))
        if not access.token_ok(given):
            return _plain(start, "401 Unauthorized", "the METRICS_TOKEN bearer token is needed",
                          ("WWW-Authenticate", 'Bearer realm="delayjobs metrics"'))  # fmt: skip
    elif not access.loopback_host(environ.get("HTTP_HOST")):  # DNS rebinding
        return _plain(start, "403 Forbidden", "without METRICS_TOKEN only a request for "
                      "localhost or a loopback address is answered")  # fmt: skip
    unreadable: dict[str, str] = {}
    try:
        with _READING:
            body = exposition.render(snapshot.read(get_engine(), unreadable), unreadable)
    except EngineUnavailable as exc:
        logger.warning("metrics: Redis is unavailable (%s)", exc)
        return _plain(start, "503 Service Unavailable", "Redis is unavailable")
    except DatabaseError as exc:  # the due time of a ready job is its row's
        logger.warning("metrics: the database is unavailable (%s)", exc)
        return _plain(start, "503 Service Unavailable", "the database is unavailable")
    finally:
        connections.close_all()  # this thread's; the next scrape runs in a new one
    snapshot.log_unreadable(logger, unreadable)
    start("200 OK", [("Content-Type", exposition.CONTENT_TYPE), ("Cache-Control", "no-store")])
    return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else body]


class MetricsServer:
    """An HTTP server on ``host:port`` in a daemon thread; ``close()`` stops it."""

    def __init__(self, host: str, port: int) -> None:
        import prometheus_client  # noqa: F401 - fail at start, not at the first scrape

        bare = host.removeprefix("[").removesuffix("]") if host.startswith("[") else host
        # An IPv6 address (the loopback ::1 included) needs an AF_INET6 socket.
        self.host, server = (bare, _Server6) if _ipv6(bare) else (host, _Server)
        self.httpd = make_server(self.host, port, app, server, _QuietHandler)
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, name="delayjobs-metrics", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if _ipv6(self.host) else self.host
        return f"http://{host}:{self.port}/metrics"

    def start(self) -> MetricsServer:
        self.thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)
