"""Mends from a fresh-eyes review of the HTTP callbacks (audit-rv6). Real servers: a
receiver on 127.0.0.1, a private Redis, the real worker (``run_delayworker --burst``)."""

from __future__ import annotations

import ipaddress

import pytest

from django_delayjobs import schedule_http
from django_delayjobs.callbacks.policy import (
    Refused,
    addresses,
    check_address,
    parse_url,
    use_resolver,
)
from django_delayjobs.callbacks.request import InvalidCallback
from django_delayjobs.models import Job, Status
from tests.callback_server import Reply
from tests.test_audit_sec import allow, burst

pytestmark = pytest.mark.django_db(transaction=True)

# -- a header value that urllib3 reads as an order, not a value ---------------------------------


@pytest.mark.parametrize("name", ["X-Trace", "Accept-Encoding"])
def test_a_header_value_urllib3_reserves_is_refused_at_the_door(settings, callback_server, name):
    """urllib3 reads the value ``@@@SKIP_HEADER@@@`` as "do not send this header" (for
    Accept-Encoding, Host and User-Agent) and raises ``ValueError`` for any other name:
    such a header was accepted, then every attempt failed (or the header was silently not
    sent) and the job was retried to its death with urllib3's words."""
    allow(settings, callback_server)
    with pytest.raises(InvalidCallback) as refused:
        schedule_http(callback_server.url(), in_=0, headers={name: "@@@SKIP_HEADER@@@"})
    assert refused.value.field == "headers"
    assert not Job.objects.exists()


def test_a_destination_header_value_urllib3_reserves_is_a_settings_error(settings, callback_server):
    from django_delayjobs.checks import check_settings

    allow(settings, callback_server, HTTP_DESTINATIONS={"hooks": {
        "url": callback_server.url("/base"), "headers": {"User-Agent": "@@@SKIP_HEADER@@@"},
    }})  # fmt: skip
    [error] = [e for e in check_settings(None) if "HTTP_DESTINATIONS" in e.msg]
    assert error.id == "django_delayjobs.E009", error


def test_a_stored_header_value_urllib3_reserves_ends_the_job_dead_with_nothing_sent(
    settings, callback_server
):
    """A row written before the door refused it: refused at delivery, dead, nothing sent."""
    allow(settings, callback_server)
    callback_server.script("/hook", Reply(200, b"ok"))
    job = schedule_http(callback_server.url(), in_=0, headers={"X-Trace": "1"})
    Job.objects.filter(pk=job.pk).update(
        kwargs={**job.kwargs, "headers": {"X-Trace": "@@@SKIP_HEADER@@@"}}
    )
    burst()
    job.refresh_from_db()
    assert job.status == Status.DEAD, job.last_error
    assert "refused, nothing sent" in job.last_error
    assert callback_server.count() == 0


# -- Azure's WireServer: a cloud metadata address that is public ---------------------------------


def _wireserver(host: str, port: int) -> list[ipaddress.IPv4Address]:
    return [ipaddress.IPv4Address("168.63.129.16")]


def test_azure_wireserver_is_refused_like_the_other_cloud_metadata_addresses(settings):
    """168.63.129.16 is a global address, so ``is_global`` let it through; on an Azure VM
    it is the WireServer (the platform's agent endpoint, beside 169.254.169.254), which a
    callback must never reach, whatever HTTP_ALLOW_PRIVATE_NETWORKS says. No traffic: the
    literal is refused at the door, and a name resolving to it by the same rule."""
    for private in (False, True):
        settings.DELAYJOBS = {
            **settings.DELAYJOBS,
            "HTTP_ALLOWED_HOSTS": ["168.63.129.16", "agent.example"],
            "HTTP_ALLOW_PRIVATE_NETWORKS": private,
        }
        with pytest.raises(Refused) as refused:
            schedule_http("http://168.63.129.16/machine?comp=goalstate", in_=0)
        assert refused.value.rule == "cloud metadata address"
        for form in ("::ffff:168.63.129.16", "64:ff9b::a83f:8110", "2002:a83f:8110::1"):
            with pytest.raises(Refused):
                check_address(ipaddress.ip_address(form), private)
        target = parse_url("http://agent.example/")
        with use_resolver(_wireserver), pytest.raises(Refused):
            addresses(target, private)
    assert not Job.objects.exists()
