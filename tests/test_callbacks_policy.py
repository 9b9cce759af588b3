"""The callback policy on its own: URL forms, the allowlist, the address rules, the resolver.

No server here: these are the rules that the SSRF battery (test_callbacks_ssrf.py) shows
end to end.
"""

from __future__ import annotations

import ipaddress
import threading
import time

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from django_delayjobs.callbacks import policy
from django_delayjobs.callbacks.policy import (
    Refused,
    Target,
    check_address,
    check_host,
    parse_allowed_host,
    parse_url,
)
from django_delayjobs.exceptions import InvalidSchedule
from tests.helpers import wait_for


def allowed(*entries: str) -> list[policy.AllowedHost]:
    return [parse_allowed_host(entry) for entry in entries]


# -- URLs ---------------------------------------------------------------------------------


def test_a_plain_url_parses_into_scheme_host_port_and_target():
    assert parse_url("https://Hooks.Example.com./a/b?x=1&y") == Target(
        "https", "hooks.example.com", 443, "/a/b?x=1&y"
    )
    assert parse_url("http://example.com:8080") == Target("http", "example.com", 8080, "/")
    assert parse_url("http://[::1]:81/x").netloc == "[::1]:81"
    assert parse_url("https://example.com:443/x").url == "https://example.com/x"


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("ftp://example.com/", "scheme"),
        ("file:///etc/passwd", "scheme"),
        ("gopher://example.com:70/_x", "scheme"),
        ("javascript:alert(1)", "scheme"),
        ("//example.com/x", "scheme"),
        ("example.com/x", "scheme"),
        ("http://user:pw@example.com/", "userinfo"),
        ("http://allowed.example@127.0.0.1/", "userinfo"),
        ("http://allowed.example:80@127.0.0.1/", "userinfo"),
        ("http://127.0.0.1\\@allowed.example/", "url"),
        ("http://example.com/a b", "url"),
        ("http://example.com/caf\u00e9", "url"),
        ("http://example.com/x?q=\u202e", "url"),
        ("http://example.com/\r\nX-Injected: 1", "url"),
        ("http://exa\x00mple.com/", "url"),
        ("http://example.com/#frag", "url"),
        ("http://example.com:0/", "url"),
        ("http://example.com:99999/", "url"),
        ("http://example.com:8o/", "url"),
        ("http:///x", "url"),
        ("http://exämple.com/", "url"),
        ("http://-bad-.com/", "url"),
        ("http://a_b.com/", "url"),
        ("http://%31%32%37.0.0.1/", "numeric"),  # percent-encoded digits
        ("http://[fe80::1%25eth0]/", "url"),
        ("http://[::1/", "url"),
        ("http://2130706433/", "numeric"),
        ("http://0177.0.0.1/", "numeric"),
        ("http://0x7f.0.0.1/", "numeric"),
        ("http://0x7f000001/", "numeric"),
        ("http://127.1/", "numeric"),
        ("http://127.0.1/", "numeric"),
        ("http://127.000.000.001/", "numeric"),
        ("http://1.2.3.4.5/", "numeric"),
        ("http://example.123/", "numeric"),
        ("http://" + "a" * 2100 + ".com/", "url"),
    ],
)
def test_hostile_url_forms_are_refused_by_rule(url, rule):
    with pytest.raises(Refused) as refused:
        parse_url(url)
    assert refused.value.rule == rule
    assert isinstance(refused.value, InvalidSchedule) and isinstance(refused.value, ValueError)


@pytest.mark.parametrize(
    "url",
    [
        "http://user:s3cret-pw@example.com/",  # refused for its user information
        "http://user:s3cret-pw@example.com/#frag",
        "http://user:s3cret-pw@example.com/a b",  # refused before it is parsed
        "ftp://user:s3cret-pw@example.com/",
        "http://user:s3cret-pw@example.com:0/",
        "http://user:s3cret-pw@2130706433/",  # the host's message shows the URL too
    ],
)
def test_a_refused_url_is_shown_without_its_password(url):
    with pytest.raises(Refused) as refused:
        parse_url(url)
    assert "s3cret-pw" not in str(refused.value)
    assert "***@" in str(refused.value)


def test_non_str_url_is_a_type_error():
    with pytest.raises(TypeError):
        parse_url(b"http://example.com/")


@settings(deadline=None)  # what it checks is the answer, not its speed on a loaded machine
@given(st.text(max_size=80))
def test_parse_url_refuses_or_returns_a_target_for_any_text(text):
    try:
        target = parse_url("http://" + text)
    except Refused:
        return
    assert target.scheme == "http" and 0 < target.port < 65536
    # what we connect to is what we parsed: parsing the rebuilt URL gives the same target
    assert parse_url(target.url) == target


# -- the allowlist --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "url", "allows"),
    [
        ("example.com", "https://example.com/x", True),
        ("example.com", "http://EXAMPLE.com./x", True),
        ("example.com", "https://example.com:8443/x", False),
        ("example.com", "https://www.example.com/x", False),
        ("example.com", "https://example.com.evil.net/x", False),
        ("example.com", "https://evilexample.com/x", False),
        ("example.com:8443", "https://example.com:8443/x", True),
        ("example.com:8443", "https://example.com/x", False),
        ("*.example.com", "https://a.example.com/", True),
        ("*.example.com", "https://a.b.example.com/", True),
        ("*.example.com", "https://example.com/", False),
        ("*.example.com", "https://aexample.com/", False),
        ("*.example.com:81", "http://a.example.com:81/", True),
        ("127.0.0.1:8000", "http://127.0.0.1:8000/", True),
        ("127.0.0.1:8000", "http://localhost:8000/", False),
        ("[::1]:8000", "http://[::1]:8000/", True),
        ("[::1]:8000", "http://[0:0::1]:8000/", True),
    ],
)
def test_allowlist_matching(entry, url, allows):
    target = parse_url(url)
    if allows:
        check_host(target, allowed(entry))
    else:
        with pytest.raises(Refused) as refused:
            check_host(target, allowed(entry))
        assert refused.value.rule == "allowlist"


def test_an_empty_allowlist_allows_nothing_and_says_so():
    with pytest.raises(Refused, match="empty: no callbacks are allowed"):
        check_host(parse_url("https://example.com/"), [])


@pytest.mark.parametrize(
    "entry",
    ["", "*", "*.com", "http://example.com", "example.com/path", "user@example.com",
     "example.com:0", "example.com:x", "*.127.0.0.1", "2130706433", "exa mple.com", 42, None],
)  # fmt: skip
def test_bad_allowlist_entries_are_refused(entry):
    with pytest.raises((TypeError, ValueError)):
        parse_allowed_host(entry)


# -- addresses --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "rule", "private_ok"),
    [
        ("127.0.0.1", "loopback", True),
        ("127.255.255.254", "loopback", True),
        ("10.1.2.3", "private network (RFC 1918)", True),
        ("172.16.0.1", "private network (RFC 1918)", True),
        ("172.31.255.255", "private network (RFC 1918)", True),
        ("192.168.0.1", "private network (RFC 1918)", True),
        ("100.64.0.1", "carrier-grade NAT (100.64.0.0/10)", True),
        ("169.254.169.254", "link-local (169.254.0.0/16, cloud metadata)", False),
        ("169.254.0.1", "link-local (169.254.0.0/16, cloud metadata)", False),
        ("100.100.100.200", "cloud metadata address", False),
        ("0.0.0.0", "this network (0.0.0.0/8)", False),
        ("0.1.2.3", "this network (0.0.0.0/8)", False),
        ("224.0.0.1", "multicast", False),
        ("239.255.255.250", "multicast", False),
        ("255.255.255.255", "broadcast", False),
        ("240.0.0.1", "reserved (240.0.0.0/4)", False),
        ("192.0.2.1", "not globally routable", False),
        ("198.18.0.1", "not globally routable", False),
        ("::", "unspecified address", False),
        ("::1", "IPv6 loopback", True),
        ("fd00::1", "IPv6 unique local (fc00::/7)", True),
        ("fc00::1", "IPv6 unique local (fc00::/7)", True),
        ("fd00:ec2::254", "cloud metadata address", False),
        ("fe80::1", "IPv6 link-local (fe80::/10)", False),
        ("fec0::1", "IPv6 site-local (fec0::/10)", False),
        ("ff02::1", "IPv6 multicast", False),
        ("::ffff:127.0.0.1", "IPv4-mapped IPv6: loopback", True),
        ("::ffff:10.0.0.1", "IPv4-mapped IPv6: private network (RFC 1918)", True),
        ("::ffff:169.254.169.254",
         "IPv4-mapped IPv6: link-local (169.254.0.0/16, cloud metadata)", False),
        ("64:ff9b::7f00:1", "NAT64 IPv6: loopback", True),
        ("2002:7f00:1::", "6to4 IPv6: loopback", True),
        ("2002:a9fe:a9fe::", "6to4 IPv6: link-local (169.254.0.0/16, cloud metadata)", False),
        ("::127.0.0.1", "IPv4-compatible IPv6: loopback", True),
        ("2001:db8::1", "not globally routable", False),
        # Ranges Python 3.11.7's is_global still calls global (fixed in 3.11.10, 3.12.4):
        ("192.0.0.8", "IETF protocol assignments (192.0.0.0/24)", False),
        ("64:ff9b:1::a9fe:a9fe", "local-use NAT64 (64:ff9b:1::/48)", False),  # the metadata one
        ("64:ff9b:1::7f00:1", "local-use NAT64 (64:ff9b:1::/48)", False),
        ("3fff::1", "IPv6 documentation (3fff::/20)", False),
        ("5f00::1", "IPv6 segment routing (5f00::/16)", False),
    ],
)  # fmt: skip
def test_address_rules(address, rule, private_ok):
    ip = ipaddress.ip_address(address)
    with pytest.raises(Refused) as refused:
        check_address(ip, allow_private=False)
    assert refused.value.rule == rule
    assert str(ip) in str(refused.value)
    if private_ok:
        check_address(ip, allow_private=True)
    else:
        with pytest.raises(Refused):
            check_address(ip, allow_private=True)


# 6to4 of 8.8.8.8: judged by the IPv4 address it carries (docs/callbacks.md), although
# Python 3.13's ipaddress no longer calls 2002::/16 global.
@pytest.mark.parametrize("address", ["93.184.215.14", "1.1.1.1", "2606:4700::1111",
                                     "::ffff:8.8.8.8", "64:ff9b::808:808",
                                     "2002:808:808::"])  # fmt: skip
def test_public_addresses_pass(address):
    check_address(ipaddress.ip_address(address), allow_private=False)


@settings(deadline=None)  # what it checks is the answer, not its speed on a loaded machine
@given(st.ip_addresses())
@example(ipaddress.ip_address("2002:100::"))  # 6to4 of 1.0.0.0: not is_global on 3.13
def test_every_address_is_either_global_or_refused(ip):
    try:
        check_address(ip, allow_private=False)
    except Refused as exc:
        refused = exc
    else:
        refused = None
    if refused is not None:
        assert refused.rule
        return
    # An IPv6 address that carries an IPv4 one (mapped, NAT64, 6to4, compatible) is
    # judged by the IPv4 address it reaches.
    embedded = policy._embedded_ipv4(ip) if ip.version == 6 else None
    inner = embedded[1] if embedded else ip
    assert inner.is_global


# -- resolution -------------------------------------------------------------------------------


def test_the_resolver_seam_decides_what_a_name_resolves_to():
    target = parse_url("http://hooks.example.com/")
    public = ipaddress.ip_address("93.184.215.14")
    with policy.use_resolver(lambda host, port: [public]):
        assert policy.addresses(target, allow_private=False) == [public]
    two = [public, ipaddress.ip_address("10.0.0.7")]
    with (
        policy.use_resolver(lambda host, port: two),
        pytest.raises(Refused, match=r"hooks.example.com resolves to 10.0.0.7") as refused,
    ):
        policy.addresses(target, allow_private=False)
    assert refused.value.rule == "private network (RFC 1918)"
    with policy.use_resolver(lambda host, port: []), pytest.raises(OSError, match="no address"):
        policy.addresses(target, allow_private=False)


def test_a_resolver_that_does_not_answer_in_time_is_given_up():
    target = parse_url("http://hooks.example.com/")
    released = threading.Event()

    def stuck(host: str, port: int) -> list[policy.IPAddress]:
        released.wait(10)  # a name server that never answers
        return [ipaddress.ip_address("93.184.215.14")]

    try:
        with policy.use_resolver(stuck):
            started = time.monotonic()
            with pytest.raises(OSError, match=r"did not answer within 0\.2 s"):
                policy.addresses(target, allow_private=False, timeout=0.2)
            assert time.monotonic() - started < 2
    finally:
        released.set()


def test_lookups_left_behind_by_a_hanging_resolver_are_bounded():
    target = parse_url("http://hooks.example.com/")
    public = ipaddress.ip_address("93.184.215.14")
    released = threading.Event()

    def stuck(host: str, port: int) -> list[policy.IPAddress]:
        released.wait(10)
        return [public]

    def lookups() -> int:  # every lookup thread alive: each holds one of the slots
        return sum(t.name.startswith("resolve ") for t in threading.enumerate())

    wait_for(lambda: lookups() == 0, timeout=15)  # those other tests left behind have ended
    try:
        with policy.use_resolver(stuck):
            for _ in range(policy.MAX_LOOKUPS):
                with pytest.raises(OSError, match="did not answer"):
                    policy.addresses(target, allow_private=False, timeout=0.001)
            assert lookups() == policy.MAX_LOOKUPS
            started = time.monotonic()
            with pytest.raises(OSError, match="still waiting for the resolver"):
                policy.addresses(target, allow_private=False, timeout=5)
            assert time.monotonic() - started < 1  # refused at once, no thread started
            assert lookups() == policy.MAX_LOOKUPS
    finally:
        released.set()
    wait_for(lambda: lookups() == 0, timeout=10)
    with policy.use_resolver(lambda host, port: [public]):
        assert policy.addresses(target, allow_private=False, timeout=5) == [public]


def test_a_resolution_within_the_limit_answers_or_fails_as_without_it():
    target = parse_url("http://hooks.example.com/")
    public = ipaddress.ip_address("93.184.215.14")

    def broken(host: str, port: int) -> list[policy.IPAddress]:
        raise OSError("Name or service not known")

    with policy.use_resolver(lambda host, port: [public]):
        assert policy.addresses(target, allow_private=False, timeout=5) == [public]
    with policy.use_resolver(broken), pytest.raises(OSError, match="not known"):
        policy.addresses(target, allow_private=False, timeout=5)
    private = [ipaddress.ip_address("10.0.0.7")]
    with policy.use_resolver(lambda host, port: private), pytest.raises(Refused):
        policy.addresses(target, allow_private=False, timeout=5)


def test_the_system_resolver_is_used_by_default():
    found = policy.addresses(parse_url("http://localhost:1/"), allow_private=True)
    assert found and all(ip.is_loopback for ip in found)
    with pytest.raises(Refused) as refused:
        policy.addresses(parse_url("http://localhost:1/"), allow_private=False)
    assert "loopback" in refused.value.rule
