"""Security audit (branch audit-sec): each test is a reproduction of a bug found, failing
until it is fixed."""

from __future__ import annotations

import ipaddress

import pytest

from django_delayjobs import schedule_http
from django_delayjobs.callbacks import policy
from django_delayjobs.callbacks.signing import new_secret
from django_delayjobs.models import Job

pytestmark = pytest.mark.django_db


@pytest.fixture
def http(settings):
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": ["hooks.example.com", "api.example.com"],
        "HTTP_ALLOW_PRIVATE_NETWORKS": False,
        "HTTP_SIGNING_SECRETS": [new_secret()],
        "HTTP_DESTINATIONS": {"payments": {"url": "https://api.example.com/v2/hooks"}},
    }
    return settings


# -- addresses that are not globally reachable (IANA special-purpose registries) pass ----


@pytest.mark.parametrize(
    "address",
    [
        # RFC 8215 local-use IPv4/IPv6 translation prefix (not globally reachable): through
        # a site's own NAT64 this is 169.254.169.254, the cloud metadata service ...
        "64:ff9b:1::a9fe:a9fe",
        # ... and 127.0.0.1
        "64:ff9b:1::7f00:1",
        # RFC 7600 IPv4 dummy address, in 192.0.0.0/24 (IETF protocol assignments)
        "192.0.0.8",
    ],
)
def test_a_name_resolving_to_a_non_global_address_is_refused(http, address):
    """docs/callbacks.md: "anything else not globally routable" is refused, and NAT64
    forms are judged "as the IPv4 address they carry"."""
    answer = [ipaddress.ip_address(address)]
    with policy.use_resolver(lambda host, port: answer):
        with pytest.raises(policy.Refused):
            schedule_http("https://hooks.example.com/x", json={}, in_=60)
        with pytest.raises(policy.Refused):
            policy.check_address(answer[0], allow_private=True)
    assert not Job.objects.exists()


# -- a destination's path leaves its base URL through a backslash -----------------------


@pytest.mark.parametrize(
    "url",
    ["payments:/..\\..\\admin", "payments:/..%5c..%5cadmin", "payments:/x/..\\/admin"],
)
def test_a_destination_path_cannot_climb_out_with_backslashes(http, url):
    """docs/callbacks.md: the path "may not leave [the destination's URL] (.. and .
    segments, even percent-encoded, are refused)"; a URL with a backslash is refused too.
    WHATWG URL parsing (Node, browsers, many proxies) and IIS read '\\' as '/', so
    /v2/hooks/..\\..\\admin is /admin there."""
    public = [ipaddress.ip_address("93.184.215.14")]
    with policy.use_resolver(lambda host, port: public):
        with pytest.raises(ValueError):
            schedule_http(url, json={}, in_=60)
    assert not Job.objects.exists()
