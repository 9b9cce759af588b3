"""Audit of the HTTP callbacks: schedule time without network waits, delivery bounded by
its total time, the signing secrets' limit, the method at both doors, addresses that carry
an IPv4 one, the outcome write of a request already sent, and keys holding a NUL.

The slow resolver is real: a UDP socket on 127.0.0.1 that takes DNS queries and never
answers, asked by a DNS client that waits on the network for its answer."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import socket
import sqlite3
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections, transaction

from django_delayjobs import schedule_http
from django_delayjobs.callbacks import policy
from django_delayjobs.callbacks.service import active_callback
from django_delayjobs.callbacks.signing import new_secret, sign
from django_delayjobs.checks import check_settings
from django_delayjobs.models import Job, Status
from tests.callback_server import Reply

pytestmark = pytest.mark.django_db(transaction=True)

#: How long the DNS client waits for an answer: far past every limit tested here.
DNS_WAIT = 30.0


class SilentDNS:
    """A DNS server on 127.0.0.1 that receives queries and never answers them."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.asked: list[tuple[bytes, Any]] = []  # the queries read: (query, client address)

    def queries(self) -> int:
        """How many queries have arrived (read without waiting)."""
        self.sock.setblocking(False)
        try:
            while True:
                self.asked.append(self.sock.recvfrom(512))
        except BlockingIOError:
            return len(self.asked)

    def resolver(self) -> policy.Resolver:
        """A DNS client that asks this server for A records and waits for the answer."""

        def resolve(host: str, port: int) -> list[policy.IPAddress]:
            query_id = int.from_bytes(os.urandom(2), "big")
            name = b"".join(bytes([len(label)]) + label for label in host.encode().split(b"."))
            query = struct.pack(">HHHHHH", query_id, 0x0100, 1, 0, 0, 0) + name + b"\0\0\1\0\1"
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
                client.settimeout(DNS_WAIT)
                client.sendto(query, ("127.0.0.1", self.port))
                answer = client.recv(512)  # a real wait on the network
            return _a_records(answer)

        return resolve

    def close(self) -> None:
        """Refuse every query at last (each client ends its lookup, no records), so that no
        lookup thread outlives its test by ``DNS_WAIT``: a later test counts them."""
        self.queries()
        for query, client in self.asked:  # the query, marked an answer with rcode REFUSED
            with contextlib.suppress(OSError):
                self.sock.sendto(query[:2] + b"\x81\x85" + query[4:], client)
        self.sock.close()


def _a_records(answer: bytes) -> list[policy.IPAddress]:
    """The A records of a DNS answer to one question (names skipped, pointers or labels)."""

    def skip_name(at: int) -> int:
        while answer[at]:
            if answer[at] >= 0xC0:
                return at + 2
            at += answer[at] + 1
        return at + 1

    count = struct.unpack(">H", answer[6:8])[0]
    at = skip_name(12) + 4
    found: list[policy.IPAddress] = []
    for _ in range(count):
        at = skip_name(at)
        kind, _, _, length = struct.unpack(">HHIH", answer[at : at + 10])
        if kind == 1 and length == 4:
            found.append(ipaddress.IPv4Address(answer[at + 10 : at + 14]))
        at += 10 + length
    return found


@pytest.fixture
def silent_dns() -> Iterator[SilentDNS]:
    server = SilentDNS()
    yield server
    server.close()


@pytest.fixture
def http(settings, redis_client, callback_server):
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": [f"callback.test:{callback_server.port}"],
        "HTTP_ALLOW_PRIVATE_NETWORKS": True,  # the server is on 127.0.0.1
        "HTTP_SIGNING_SECRETS": [new_secret()],
        "RETRY_BACKOFF_SECONDS": 60,
    }
    return callback_server


# -- 1. schedule time does no lookup --------------------------------------------------------


def test_schedule_http_does_not_wait_for_the_resolver_inside_the_callers_transaction(
    http, settings, silent_dns
):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "HTTP_CONNECT_TIMEOUT_SECONDS": 3}
    with policy.use_resolver(silent_dns.resolver()), transaction.atomic():
        started = time.monotonic()
        job = schedule_http(f"http://callback.test:{http.port}/", in_=60)
        waited = time.monotonic() - started
    assert waited < 1, f"schedule_http held the caller's transaction for {waited:.1f} s"
    assert silent_dns.queries() == 0  # the name is resolved at delivery only
    assert Job.objects.get(pk=job.pk).status == Status.SCHEDULED


def test_a_name_that_resolves_to_a_forbidden_address_is_refused_at_delivery(http, settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "HTTP_ALLOW_PRIVATE_NETWORKS": False}
    loopback = [ipaddress.ip_address("127.0.0.1")]
    with policy.use_resolver(lambda host, port: loopback):
        job = schedule_http(f"http://callback.test:{http.port}/", in_=0)  # no lookup now
        call_command("run_delayworker", "--burst", "-v", "0")
    job.refresh_from_db()
    assert job.status == Status.DEAD and "callback.test resolves to 127.0.0.1" in job.last_error
    assert http.count() == 0


# -- 2. the whole delivery within HTTP_TIMEOUT_SECONDS ---------------------------------------


def test_a_slow_resolver_at_delivery_is_bounded_by_the_total_time(http, settings, silent_dns):
    job = schedule_http(f"http://callback.test:{http.port}/", in_=0)
    settings.DELAYJOBS = {**settings.DELAYJOBS, "HTTP_CONNECT_TIMEOUT_SECONDS": 5,
                          "HTTP_TIMEOUT_SECONDS": 0.5}  # fmt: skip
    with policy.use_resolver(silent_dns.resolver()):
        started = time.monotonic()
        call_command("run_delayworker", "--burst", "-v", "0")
        waited = time.monotonic() - started
    assert silent_dns.queries() == 1  # the lookup did wait on the network
    assert waited < 3, f"the delivery took {waited:.1f} s, past HTTP_TIMEOUT_SECONDS (0.5)"
    job.refresh_from_db()
    assert job.status == Status.RETRYING and "did not resolve" in job.last_error
    assert http.count() == 0


# -- 3. at most 16 signing secrets, said so ---------------------------------------------------


def _check_messages(settings, **http) -> list[tuple[str, str]]:
    settings.DELAYJOBS = {"REDIS_URL": "redis://x/0", **http}
    return [(error.id, error.msg) for error in check_settings()]


@pytest.mark.parametrize("where", ["HTTP_SIGNING_SECRETS", "HTTP_DESTINATIONS"])
def test_a_17th_signing_secret_is_a_check_error_naming_the_limit(settings, where):
    secrets = [new_secret() for _ in range(17)]
    http = {"HTTP_ALLOWED_HOSTS": ["a.example"], "HTTP_SIGNING_SECRETS": secrets[:1]}
    if where == "HTTP_SIGNING_SECRETS":
        http[where] = secrets
    else:
        http[where] = {"a": {"url": "https://a.example", "signing_secrets": secrets}}
    errors = _check_messages(settings, **http)
    assert [id for id, _ in errors] == ["django_delayjobs.E009"], errors
    assert "at most 16" in errors[0][1] and where in errors[0][1]
    http[where] = (
        secrets[:16]
        if where == "HTTP_SIGNING_SECRETS"
        else {"a": {"url": "https://a.example", "signing_secrets": secrets[:16]}}
    )
    assert _check_messages(settings, **http) == []


def test_sign_refuses_more_secrets_than_it_signs_with():
    secrets = [new_secret() for _ in range(17)]
    assert len(sign("id", b"x", secrets[:16])["webhook-signature"].split()) == 16
    with pytest.raises(ValueError, match="at most 16"):
        sign("id", b"x", secrets)


# -- 4. one method check at both doors ----------------------------------------------------------

#: "po\u017ft" (a long s) is "POST" to str.upper(); "\uff30..." is a full-width "POST".
HOSTILE_METHODS = ["", "GET ", " POST", "P\x00OST", "POST\r\n", "X" * 10_000, "po\u017ft",
                   "\uff30\uff2f\uff33\uff34", "POST\u200b", "TRACE", None, 1,
                   ["POST"]]  # fmt: skip


@pytest.fixture
def api(http):
    from tests.test_rest_helpers import client_for, make_user

    return client_for(make_user(superuser=True))


def _post(api, body):
    from tests.test_rest_helpers import url

    return api.post(url("callbacks"), body, format="json")


@pytest.mark.parametrize("method", ["post", "Post", "get", "delete"])
def test_a_lower_case_method_is_accepted_at_both_doors_as_upper_case(http, api, method):
    hook = f"http://callback.test:{http.port}/"
    assert schedule_http(hook, method=method, in_=60).kwargs["method"] == method.upper()
    response = _post(api, {"url": hook, "method": method, "in": 60})
    assert response.status_code == 201, response.json()
    assert response.json()["kwargs"]["method"] == method.upper()


@pytest.mark.parametrize("method", HOSTILE_METHODS, ids=lambda method: repr(method)[:20])
def test_a_hostile_method_is_refused_at_both_doors_alike(http, api, method):
    hook = f"http://callback.test:{http.port}/"
    with pytest.raises((TypeError, ValueError)) as refused:
        schedule_http(hook, method=method, in_=60)
    assert len(str(refused.value)) < 300  # a 10k method is not repeated whole
    response = _post(api, {"url": hook, "method": method, "in": 60})
    assert response.status_code == 400, response.json()
    assert list(response.json()) == ["method"]
    assert len(json.dumps(response.json())) < 400
    assert not Job.objects.exists()


# -- 5. the outcome of a request already sent is not lost to SQLite's write lock --------------


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's write lock")
@pytest.mark.parametrize(("status", "after"), [(200, Status.SUCCEEDED), (503, Status.RETRYING)])
def test_a_write_lock_held_past_the_busy_timeout_does_not_send_the_callback_again(
    http, settings, status, after
):
    """Another connection takes SQLite's write lock while the receiver answers, and holds
    it past the worker's busy timeout (0.5 s) as the worker records the outcome. The
    request has gone out: the outcome must be written once the lock is free, not counted
    as a failure of the action or handed back, either of which sends it again."""
    options = connections.settings["default"].setdefault("OPTIONS", {})
    saved = options.get("timeout")
    http.script("/", Reply(status, delay=0.3))  # the lock is taken before the answer
    job = schedule_http(f"http://callback.test:{http.port}/", in_=0, max_attempts=3)

    def hold_the_write_lock() -> None:
        http.wait_for(1)
        other = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        time.sleep(1.5)  # three busy timeouts
        other.execute("COMMIT")
        other.close()

    holder = threading.Thread(target=hold_the_write_lock, daemon=True)
    holder.start()
    options["timeout"] = 0.5  # the burst's worker thread opens its connection with it
    loopback = [ipaddress.ip_address("127.0.0.1")]
    try:
        with policy.use_resolver(lambda host, port: loopback):
            deadline = time.monotonic() + 15
            while Job.objects.get(pk=job.pk).status == Status.SCHEDULED or (
                Job.objects.get(pk=job.pk).status == Status.RUNNING and time.monotonic() < deadline
            ):
                with contextlib.suppress(CommandError):  # a hand-back: a burst fell short
                    call_command("run_delayworker", "--burst", "-v", "0")
                time.sleep(0.2)
    finally:
        options["timeout"] = saved
        holder.join(5)
    job.refresh_from_db()
    history = [(e.kind, e.message[:120]) for e in job.events.order_by("id")]
    assert http.count() == 1, (http.count(), job.attempts, job.deliveries, history)
    assert (job.status, job.attempts) == (after, 1), job.last_error


# -- 6. IPv6 addresses that carry a forbidden IPv4 one ------------------------------------------

CARRIERS = {
    "6to4": "2002:7f00:1::",
    "6to4-metadata": "2002:a9fe:a9fe::",
    "nat64": "64:ff9b::7f00:1",
    "nat64-private": "64:ff9b::a00:1",
    "mapped": "::ffff:127.0.0.1",
    "compatible": "::127.0.0.1",
    "translated": "::ffff:0:7f00:1",  # SIIT's IPv4-translated form (RFC 2765)
    "reserved": "::1:7f00:1",  # the rest of ::/8: reserved, never routable
}


@pytest.mark.parametrize("name", list(CARRIERS))
def test_an_ipv6_address_carrying_a_forbidden_ipv4_one_is_refused_at_both_times(
    http, settings, name
):
    address = CARRIERS[name]
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": [f"[{address}]:{http.port}", f"callback.test:{http.port}"],
        "HTTP_ALLOW_PRIVATE_NETWORKS": False,
    }
    with pytest.raises(policy.Refused):  # schedule time: the address is in the URL
        schedule_http(f"http://[{address}]:{http.port}/", in_=0)
    resolved = [ipaddress.ip_address(address)]
    with policy.use_resolver(lambda host, port: resolved):  # delivery: a name resolves to it
        job = schedule_http(f"http://callback.test:{http.port}/", in_=0, max_attempts=3)
        call_command("run_delayworker", "--burst", "-v", "0")
    job.refresh_from_db()
    assert job.status == Status.DEAD and "refused, nothing sent" in job.last_error, (
        job.status,
        job.last_error,
    )
    assert http.count() == 0


# -- 7. active_callback checks its key and queue as schedule_http does ---------------------------


@pytest.mark.parametrize(
    ("key", "queue", "error"),
    [
        ("a\x00b", None, ValueError),
        ("x" * 256, None, ValueError),
        ("", None, TypeError),
        (None, None, TypeError),
        (42, None, TypeError),
        ("ok", "de\x00fault", ValueError),
    ],
    ids=["nul", "too-long", "empty", "none", "int", "nul-queue"],
)
def test_active_callback_refuses_a_key_or_queue_the_door_refuses(http, key, queue, error):
    schedule_http(f"http://callback.test:{http.port}/", in_=60)  # a keyless active callback
    with pytest.raises(error):
        active_callback(key, queue)
    assert active_callback("ok") is None
