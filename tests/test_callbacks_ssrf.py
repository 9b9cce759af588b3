"""The SSRF battery: hostile URLs and resolutions, each refused at the door where the door
can see it, and -- planted as a row anyway, as an older version or a manual edit could --
dead at delivery with a reason that names the rule, the recording servers (on 127.0.0.1
and ::1, at the port every hostile URL names) receiving nothing.

A safety net stands behind the policy: the test process may connect to loopback only (an
audit hook in conftest.py), so a policy bug here fails the test instead of leaving the
machine; ``OUTSIDE_CONNECTS`` must stay empty.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from django.core.management import call_command

from django_delayjobs import schedule_http
from django_delayjobs.callbacks import policy
from django_delayjobs.callbacks.signing import new_secret
from django_delayjobs.models import Job, Status
from tests import conftest
from tests.callback_server import CallbackServer, Reply
from tests.helpers import planted_callback

pytestmark = pytest.mark.django_db(transaction=True)

PUBLIC = "93.184.215.14"


@dataclass(frozen=True)
class Case:
    url: str  # "{p}" is the IPv4 server's port, "{p6}" the IPv6 server's
    reason: str  # what the dead job's error must say: the rule's name
    door: bool = True  # schedule_http refuses it already (a name is resolved at delivery)
    resolves: tuple[str, ...] = ()  # what the name resolves to at delivery (resolver hook)
    at_door: tuple[str, ...] = ()  # ... and at schedule time, if different


CASES = {
    "loopback": Case("http://127.0.0.1:{p}/", "loopback"),
    "loopback-2": Case("http://127.0.0.2:{p}/", "loopback"),
    "localhost": Case("http://localhost:{p}/", "localhost resolves to 127.0.0.1 is loopback",
                      door=False),
    "localhost-dot": Case("http://localhost.:{p}/", "is loopback", door=False),
    "ipv6-loopback": Case("http://[::1]:{p6}/", "IPv6 loopback"),
    "ipv4-mapped-loopback": Case("http://[::ffff:127.0.0.1]:{p}/", "IPv4-mapped IPv6: loopback"),
    "ipv4-mapped-by-dns": Case("http://mapped.test:{p}/", "IPv4-mapped IPv6 of 10.0.0.1",
                               door=False, resolves=("::ffff:10.0.0.1",)),
    "nat64-loopback": Case("http://[64:ff9b::7f00:1]:{p}/", "NAT64 IPv6"),
    "6to4-loopback": Case("http://[2002:7f00:1::]:{p}/", "6to4 IPv6"),
    "unspecified-v6": Case("http://[::]:{p}/", "unspecified address"),
    "this-network": Case("http://0.0.0.0:{p}/", "this network (0.0.0.0/8)"),
    "rfc1918-10": Case("http://10.0.0.1:{p}/", "private network (RFC 1918)"),
    "rfc1918-172": Case("http://172.16.0.1:{p}/", "private network (RFC 1918)"),
    "rfc1918-192": Case("http://192.168.1.1:{p}/", "private network (RFC 1918)"),
    "metadata": Case("http://169.254.169.254:{p}/latest/meta-data/", "link-local"),
    "metadata-by-dns": Case("http://metadata.test:{p}/", "169.254.169.254 is link-local",
                            door=False, resolves=("169.254.169.254",)),
    "cgnat": Case("http://100.64.0.1:{p}/", "carrier-grade NAT"),
    "multicast": Case("http://224.0.0.1:{p}/", "multicast"),
    "broadcast": Case("http://255.255.255.255:{p}/", "broadcast"),
    "ula": Case("http://[fd00::1]:{p}/", "IPv6 unique local"),
    "link-local-v6": Case("http://[fe80::1]:{p}/", "IPv6 link-local"),
    "decimal": Case("http://2130706433:{p}/", "numeric trick form"),
    "octal": Case("http://0177.0.0.1:{p}/", "numeric trick form"),
    "hex-dotted": Case("http://0x7f.0.0.1:{p}/", "numeric trick form"),
    "hex-whole": Case("http://0x7f000001:{p}/", "numeric trick form"),
    "short": Case("http://127.1:{p}/", "numeric trick form"),
    "userinfo": Case("http://allowed.test@127.0.0.1:{p}/", "user information"),
    "userinfo-password": Case("http://allowed.test:{p}@127.0.0.1:{p}/", "user information"),
    "name-to-loopback": Case("http://internal.test:{p}/", "internal.test resolves to 127.0.0.1",
                             door=False, resolves=("127.0.0.1",)),
    "dns-rebinding": Case("http://rebind.test:{p}/", "rebind.test resolves to 127.0.0.1",
                          door=False, resolves=("127.0.0.1",), at_door=(PUBLIC,)),
    "public-and-private": Case("http://mixed.test:{p}/", "resolves to 10.0.0.1",
                               door=False, resolves=(PUBLIC, "10.0.0.1")),
    "not-allowed": Case("http://evil.test:{p}/", "not in HTTP_ALLOWED_HOSTS",
                        resolves=("127.0.0.1",)),
    "suffix-trick": Case("http://allowed.test.evil.test:{p}/", "not in HTTP_ALLOWED_HOSTS",
                         resolves=("127.0.0.1",)),
    "wrong-port": Case("http://allowed.test:1/", "not in HTTP_ALLOWED_HOSTS",
                       resolves=("127.0.0.1",)),
    "scheme": Case("gopher://127.0.0.1:{p}/_x", "not http or https"),
}  # fmt: skip

ALLOWED = [
    "127.0.0.1:{p}", "127.0.0.2:{p}", "localhost:{p}", "[::1]:{p6}", "[::ffff:127.0.0.1]:{p}",
    "mapped.test:{p}", "[64:ff9b::7f00:1]:{p}", "[2002:7f00:1::]:{p}", "[::]:{p}",
    "0.0.0.0:{p}", "10.0.0.1:{p}", "172.16.0.1:{p}", "192.168.1.1:{p}", "169.254.169.254:{p}",
    "metadata.test:{p}", "100.64.0.1:{p}", "224.0.0.1:{p}", "255.255.255.255:{p}",
    "[fd00::1]:{p}", "[fe80::1]:{p}", "internal.test:{p}", "rebind.test:{p}", "mixed.test:{p}",
    "allowed.test:{p}",
]  # fmt: skip


@pytest.fixture
def servers(callback_server: CallbackServer) -> Iterator[tuple[CallbackServer, CallbackServer]]:
    v6 = CallbackServer(host="::1")
    yield callback_server, v6
    v6.close()


def resolver(table: dict[str, tuple[str, ...]]) -> policy.Resolver:
    def resolve(host: str, port: int) -> list[policy.IPAddress]:
        if host in table:
            return [ipaddress.ip_address(a) for a in table[host]]
        return policy.system_resolver(host, port)  # localhost

    return resolve


def test_the_battery_is_large_enough():
    assert len(CASES) >= 25


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_callback_is_refused_and_nothing_is_sent(name, servers, settings, redis_client):
    case = CASES[name]
    v4, v6 = servers
    fill = {"p": v4.port, "p6": v6.port}
    url = case.url.format(**fill)
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": [entry.format(**fill) for entry in ALLOWED],
        "HTTP_ALLOW_PRIVATE_NETWORKS": False,
        "HTTP_SIGNING_SECRETS": [new_secret()],
    }
    host = url.split("//", 1)[1].split(":", 1)[0]
    at_door = case.at_door or case.resolves
    with policy.use_resolver(resolver({host: at_door} if at_door else {})):
        if case.door:
            with pytest.raises(policy.Refused) as refused:
                schedule_http(url, json={"x": 1}, in_=0)
            assert case.reason in f"{refused.value} [rule: {getattr(refused.value, 'rule', '')}]"
            assert not Job.objects.exists()
            # planted anyway: the delivery checks everything again
            job = planted_callback({"method": "POST", "url": url, "body": "{}"}, max_attempts=5)
        else:
            job = schedule_http(url, json={"x": 1}, in_=0, max_attempts=5)
    with policy.use_resolver(resolver({host: case.resolves} if case.resolves else {})):
        call_command("run_delayworker", "--burst", "-v", "0")
    job.refresh_from_db()
    assert job.status == Status.DEAD and job.attempts == 1, (job.status, job.last_error)
    assert "refused, nothing sent" in job.last_error and case.reason in job.last_error
    if case.door:  # the door names the same rule
        assert refused.value.rule in job.last_error
    assert v4.count() == 0 and v6.count() == 0
    assert conftest.OUTSIDE_CONNECTS == []


def test_a_redirect_to_a_private_address_is_not_followed(servers, settings, redis_client):
    target, _ = servers
    redirector = CallbackServer()
    try:
        settings.DELAYJOBS = {
            **settings.DELAYJOBS,
            "HTTP_ALLOWED_HOSTS": [redirector.netloc, target.netloc],
            "HTTP_ALLOW_PRIVATE_NETWORKS": True,  # the redirector is on 127.0.0.1 too
        }
        redirector.script("/hook", Reply(302, b"", {"Location": target.url("/internal")}))
        job = schedule_http(redirector.url(), json={}, in_=0, max_attempts=5)
        call_command("run_delayworker", "--burst", "-v", "0")
        job.refresh_from_db()
        assert job.status == Status.DEAD and job.attempts == 1
        assert "302" in job.last_error and "a redirect is not followed" in job.last_error
        assert redirector.count() == 1 and target.count() == 0
    finally:
        redirector.close()


def test_the_same_host_is_delivered_when_private_networks_are_allowed(servers, settings,
                                                                     redis_client):  # fmt: skip
    """The control: with the setting on, the battery's loopback URL does arrive."""
    v4, _ = servers
    settings.DELAYJOBS = {**settings.DELAYJOBS, "HTTP_ALLOWED_HOSTS": [v4.netloc],
                          "HTTP_ALLOW_PRIVATE_NETWORKS": True}  # fmt: skip
    job = schedule_http(v4.url("/"), json={}, in_=0)
    call_command("run_delayworker", "--burst", "-v", "0")
    job.refresh_from_db()
    assert job.status == Status.SUCCEEDED and v4.count() == 1
