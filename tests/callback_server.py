"""A real HTTP(S) server on 127.0.0.1 for the callback tests: it records every request
and answers each path from a script (status, headers, body, delay, hang, a huge body).

Threaded: one thread per connection. A request is recorded as soon as it has been read,
before the server answers (or hangs), so a test can see a request that is in flight.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import struct
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    status: int = 200
    body: bytes = b'{"ok":true}'
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})
    delay: float = 0.0  # seconds before answering
    hang: bool = False  # never answer (until the server closes)
    stream: int = 0  # send this many bytes of body (in 64 KiB writes) instead of ``body``
    trickle: float = 0.0  # send a never-ending header, one byte per this many seconds


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    at: float  # time.time() when it was read
    client: str


class CallbackServer:
    def __init__(self, tls: ssl.SSLContext | None = None, host: str = "127.0.0.1") -> None:
        self.requests: list[Recorded] = []
        self.lock = threading.Lock()
        self.scripts: dict[str, deque[Reply]] = defaultdict(deque)
        self.default = Reply()
        self.closing = threading.Event()
        self.streamed: list[tuple[int, str]] = []  # (bytes written, how it ended) per stream
        self.tls = tls
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server_class = type("Server", (ThreadingHTTPServer,), {"address_family": family})
        self.httpd = server_class((host, 0), _handler(self))
        self.httpd.daemon_threads = True
        self.host = host
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    # -- for tests ----------------------------------------------------------------------

    @property
    def netloc(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def url(self, path: str = "/hook", host: str | None = None) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{host or self.host}:{self.port}{path}"

    def script(self, path: str, *replies: Reply) -> None:
        """Answer the next requests to ``path`` with these replies, then the default."""
        with self.lock:
            self.scripts[path].extend(replies)

    def count(self) -> int:
        with self.lock:
            return len(self.requests)

    def wait_for(self, n: int, timeout: float = 20.0) -> list[Recorded]:
        deadline = time.monotonic() + timeout
        while self.count() < n:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.count()} request(s), not {n}, within {timeout} s")
            time.sleep(0.01)
        with self.lock:
            return list(self.requests)

    def close(self) -> None:
        self.closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- for the handler -------------------------------------------------------------------

    def next_reply(self, path: str) -> Reply:
        with self.lock:
            queue = self.scripts.get(path.partition("?")[0])
            return queue.popleft() if queue else self.default

    def record(self, request: Recorded) -> None:
        with self.lock:
            self.requests.append(request)


def _handler(server: CallbackServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            self.refused = False
            if server.tls is not None:
                try:
                    self.request = server.tls.wrap_socket(self.request, server_side=True)
                except (ssl.SSLError, OSError):  # the client refused our certificate
                    self.refused = True
            super().setup()

        def finish(self) -> None:
            super().finish()
            if server.tls is not None:
                self.request.close()  # the TLS wrapper owns the socket now

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet

        def handle_one(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            server.record(Recorded(
                self.command, self.path, {k.lower(): v for k, v in self.headers.items()},
                body, time.time(), self.client_address[0],
            ))  # fmt: skip
            reply = server.next_reply(self.path)
            if reply.hang:
                server.closing.wait(120)
                return
            if reply.delay:
                time.sleep(reply.delay)
            if reply.trickle:  # an answer that never ends, one byte at a time
                self.wfile.write(f"HTTP/1.1 {reply.status} OK\r\nX-Slow: ".encode())
                while not server.closing.wait(reply.trickle):
                    self.wfile.write(b"a")
                return
            self.send_response(reply.status)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            size = reply.stream or len(reply.body)
            self.send_header("Content-Length", str(size))
            self.send_header("Connection", "close")
            self.end_headers()
            if self.command == "HEAD":
                return
            if reply.stream:
                self.stream(reply.stream)
            else:
                self.wfile.write(reply.body)

        def stream(self, size: int) -> None:
            chunk, sent = b"x" * 65536, 0
            try:
                while sent < size:
                    self.wfile.write(chunk[: size - sent])
                    sent += min(len(chunk), size - sent)
                ended = "complete"
            except OSError as exc:
                ended = type(exc).__name__
            with server.lock:
                server.streamed.append((sent, ended))

        def handle(self) -> None:
            if self.refused:
                return
            with contextlib.suppress(OSError, ssl.SSLError):
                self.raw_requestline = self.rfile.readline(65537)
                if not self.raw_requestline or not self.parse_request():
                    return
                self.handle_one()
                self.wfile.flush()

    return Handler


def json_body(request: Recorded) -> Any:
    return json.loads(request.body)


class TcpServer:
    """A TCP server on 127.0.0.1: a thread accepts connections until ``close()`` and
    hands each to ``handle(conn)``, which a subclass writes (and whose attributes it sets
    before calling this ``__init__``: the thread starts here)."""

    def __init__(self, rcvbuf: int = 0) -> None:
        self.closing = threading.Event()
        self.sock = socket.socket()
        if rcvbuf:  # a small window: a large request is still being sent when it answers
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def netloc(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, path: str = "/hook") -> str:
        return f"http://{self.netloc}{path}"

    def handle(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def _serve(self) -> None:
        while not self.closing.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.handle(conn)

    def close(self) -> None:
        self.closing.set()
        self.thread.join(2)
        self.sock.close()


def read_request(conn: socket.socket, whole: bool = True) -> bytes:
    """Read one request's head and, if ``whole``, its ``Content-Length`` body (less if
    the client closes first); return what was read."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return data
        data += chunk
    if not whole:
        return data
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n")
         if line.lower().startswith(b"content-length:")), 0,
    )  # fmt: skip
    while len(body) < length and (chunk := conn.recv(65536)):
        body += chunk
    return head + b"\r\n\r\n" + body


class RawServer(TcpServer):
    """Reads one HTTP request per connection and answers it with scripted raw bytes (what
    an ordinary server framework would not send), or by calling ``answer(conn)`` to write
    whatever it likes."""

    def __init__(self, answer: bytes | Callable[[socket.socket], None], reset: bool = False):
        self.answer = answer
        self.reset = reset  # end the connection with a TCP reset after the answer
        self.requests: list[bytes] = []
        super().__init__()

    def handle(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(5)
            self.requests.append(read_request(conn))
            if callable(self.answer):
                self.answer(conn)
            else:
                conn.sendall(self.answer)
            if self.reset:
                time.sleep(0.3)  # the client has read the status line and headers
                linger = struct.pack("ii", 1, 0)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                return  # closed by the with: a reset, not a FIN
            conn.shutdown(socket.SHUT_WR)
            time.sleep(0.05)
