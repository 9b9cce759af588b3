"""``schedule_http`` at the door: what a callback job stores, and every hostile input
refused with TypeError/ValueError before anything is written. Also the HTTP_* checks."""

from __future__ import annotations

import ipaddress
from datetime import timedelta
from decimal import Decimal

import pytest

from django_delayjobs import schedule, schedule_http
from django_delayjobs.callbacks import policy
from django_delayjobs.callbacks.action import ACTION
from django_delayjobs.callbacks.request import InvalidCallback, load
from django_delayjobs.callbacks.service import KeyHeld
from django_delayjobs.callbacks.signing import new_secret
from django_delayjobs.checks import check_settings
from django_delayjobs.models import Job, JobEvent
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

SECRET = new_secret()
TOKEN = "Bearer s3cr3t-token"


@pytest.fixture(autouse=True)
def http(settings):
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": ["hooks.example.com", "*.pay.example", "api.example.com:8443"],
        "HTTP_SIGNING_SECRETS": [SECRET],
        "HTTP_DESTINATIONS": {
            "payments": {
                "url": "https://api.example.com:8443/v2/",
                "headers": {"Authorization": TOKEN},
            }
        },
    }
    public = [ipaddress.ip_address("93.184.215.14")]
    with policy.use_resolver(lambda host, port: public):
        yield settings


def test_a_url_callback_stores_its_request_in_an_ordinary_job():
    job = schedule_http(
        "https://hooks.example.com/orders/expire?x=1", json={"order": 42, "at": Decimal("1.50")},
        headers={"X-Trace": "t-1"}, in_=timedelta(minutes=30), key="order-42-expire",
        max_attempts=7, queue="hooks",
    )  # fmt: skip
    job.refresh_from_db()
    assert job.action == ACTION and job.target_type is None
    assert (job.key, job.queue, job.max_attempts, job.status) == ("order-42-expire", "hooks", 7,
                                                                   "scheduled")  # fmt: skip
    assert job.args == []
    assert job.kwargs == {
        "method": "POST",
        "url": "https://hooks.example.com/orders/expire?x=1",
        "headers": {"X-Trace": "t-1", "Content-Type": "application/json"},
        "body": '{"order":42,"at":"1.50"}',
    }
    assert load(job.kwargs).where == "https://hooks.example.com/orders/expire?x=1"
    assert list(job.events.values_list("kind", flat=True)) == ["scheduled"]


def test_a_destination_callback_stores_its_name_and_path_never_its_secret():
    job = schedule_http("payments:/hooks/expire", method="put", data="plain text", at=None, in_=5)
    job.refresh_from_db()
    assert job.kwargs == {
        "method": "PUT",
        "destination": "payments",
        "path": "/hooks/expire",
        "headers": {"Content-Type": "text/plain; charset=utf-8"},
        "body": "plain text",
    }
    row = str(Job.objects.filter(pk=job.pk).values().get()) + str(
        list(JobEvent.objects.filter(job=job).values())
    )
    assert "s3cr3t" not in row and "api.example.com" not in row


def test_forms_and_bodiless_methods():
    job = schedule_http("https://a.pay.example/f", data={"a": "1", "b": 2}, in_=0)
    assert job.kwargs["body"] == "a=1&b=2"
    assert job.kwargs["headers"] == {"Content-Type": "application/x-www-form-urlencoded"}
    job = schedule_http("https://hooks.example.com/", method="GET", in_=0)
    assert job.kwargs == {"method": "GET", "url": "https://hooks.example.com/"}
    custom = schedule_http("https://hooks.example.com/", json=[1], in_=0,
                           headers={"content-type": "application/cloudevents+json"})  # fmt: skip
    assert custom.kwargs["headers"] == {"content-type": "application/cloudevents+json"}


def test_the_same_key_returns_the_active_job():
    first = schedule_http("https://hooks.example.com/a", in_=60, key="k")
    again = schedule_http("https://hooks.example.com/b", in_=5, key="k")
    assert again.pk == first.pk and Job.objects.count() == 1


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"method": "TRACE"}, ValueError, "method must be one of"),
        ({"method": "CONNECT"}, ValueError, "method must be one of"),
        ({"method": 1}, ValueError, "method must be one of"),
        ({"method": "GET", "json": {"a": 1}}, ValueError, "GET request has no body"),
        ({"method": "HEAD", "data": "x"}, ValueError, "HEAD request has no body"),
        ({"json": {}, "data": "x"}, ValueError, "not both"),
        ({"json": {"a": object()}}, ValueError, "not JSON"),
        ({"json": {"a": float("nan")}}, ValueError, "not JSON"),
        ({"json": {1j: 2}}, ValueError, "not JSON"),
        ({"data": b"\xff\xfe"}, ValueError, "UTF-8"),
        ({"data": "a\x00b"}, ValueError, "NUL"),
        ({"data": "\ud800"}, ValueError, "surrogate"),
        ({"json": {"a": "\ud800"}}, ValueError, "surrogate"),
        ({"data": {"a": "\ud800"}}, ValueError, "surrogate"),
        ({"data": {"\udfff": "x"}}, ValueError, "surrogate"),
        ({"data": 5}, TypeError, "data= must be"),
        ({"data": {"a": [1]}}, TypeError, "form"),
        ({"data": "x" * 70_000}, ValueError, "HTTP_MAX_REQUEST_BYTES"),
        ({"headers": {"X-A": "a\r\nInjected: 1"}}, ValueError, "no CR, LF"),
        ({"headers": {"X-A": "a\nb"}}, ValueError, "no CR, LF"),
        ({"headers": {"X-A": "caf\u00e9"}}, ValueError, "visible ASCII"),
        ({"headers": {"Bad Name": "x"}}, ValueError, "legal HTTP token"),
        ({"headers": {"X:A": "x"}}, ValueError, "legal HTTP token"),
        ({"headers": {"": "x"}}, ValueError, "legal HTTP token"),
        ({"headers": {"X-A": 1}}, TypeError, "must be str"),
        ({"headers": ["X-A"]}, TypeError, "dict"),
        ({"headers": {f"X-{n}": "1" for n in range(33)}}, ValueError, "at most 32"),
        # The Content-Type a body adds counts: stored as 33, the job could never be sent.
        ({"json": {}, "headers": {f"X-{n}": "1" for n in range(32)}}, ValueError, "at most 32"),
        ({"headers": {"X-A": "1", "x-a": "2"}}, ValueError, "twice"),
        ({"headers": {"Host": "evil.example"}}, ValueError, "set by the delivery"),
        ({"headers": {"Content-Length": "0"}}, ValueError, "set by the delivery"),
        ({"headers": {"Transfer-Encoding": "chunked"}}, ValueError, "set by the delivery"),
        ({"headers": {"webhook-signature": "v1,x"}}, ValueError, "set by the delivery"),
        ({"headers": {"webhook-id": "x"}}, ValueError, "set by the delivery"),
        ({"headers": {"Authorization": TOKEN}}, ValueError, "HTTP_DESTINATIONS"),
        ({"headers": {"cookie": "a=b"}}, ValueError, "credential"),
        ({"headers": {"X-Api-Key": "k"}}, ValueError, "credential"),
        ({"key": ""}, TypeError, "key must be"),
        ({"key": "k" * 256}, ValueError, "at most 255"),
        ({"queue": "a:b"}, ValueError, "queue"),
        ({"max_attempts": 0}, ValueError, "at least 1"),
        ({"expires": -1}, ValueError, "non-negative"),
        ({"in_": None}, TypeError, "exactly one"),
        ({"at": "2030-01-01"}, TypeError, "exactly one"),
    ],
)
def test_hostile_arguments_are_refused_and_nothing_is_written(kwargs, error, match):
    call = {"in_": 10, **kwargs}
    with pytest.raises(error, match=match) as info:
        schedule_http("https://hooks.example.com/x", **call)
    assert not isinstance(info.value, UnicodeError), repr(info.value)  # a ValueError too
    assert not Job.objects.exists() and not JobEvent.objects.exists()


def test_a_body_and_the_most_headers_it_leaves_room_for_are_stored_and_load_again():
    headers = {f"X-{n}": "1" for n in range(31)}
    job = schedule_http("https://hooks.example.com/x", json={}, headers=headers, in_=10)
    assert load(job.kwargs).headers == {**headers, "Content-Type": "application/json"}


def test_a_body_within_http_max_request_bytes_is_still_held_to_max_json_bytes(http):
    """At the defaults the largest body fits even written at its longest (\\uXXXX for each
    non-ASCII character); a larger HTTP_MAX_REQUEST_BYTES meets MAX_JSON_BYTES by name."""
    body = "\u00e9" * (65536 // 2)  # 64 KiB of UTF-8, 192 KiB as json.dumps writes it
    job = schedule_http("https://hooks.example.com/x", data=body, in_=10)
    assert load(Job.objects.get(pk=job.pk).kwargs).body == body
    http.DELAYJOBS = {**http.DELAYJOBS, "HTTP_MAX_REQUEST_BYTES": 1 << 20}
    with pytest.raises(ValueError, match="MAX_JSON_BYTES"):
        schedule_http("https://hooks.example.com/x", data="x" * (1 << 20), in_=10)
    assert Job.objects.count() == 1


@pytest.mark.parametrize(
    ("url", "rule_or_text"),
    [
        ("https://evil.example.com/", "not in HTTP_ALLOWED_HOSTS"),
        ("https://hooks.example.com.evil.net/", "not in HTTP_ALLOWED_HOSTS"),
        ("https://hooks.example.com:444/", "not in HTTP_ALLOWED_HOSTS"),
        ("https://pay.example/", "not in HTTP_ALLOWED_HOSTS"),
        ("http://hooks.example.com@127.0.0.1/", "user information"),
        ("ftp://hooks.example.com/", "not http or https"),
        ("https://2130706433/", "numeric trick"),
        ("nowhere:/x", "names no destination"),
        ("payments:x", "not http or https"),
        ("payments:/../admin", "'..' segments"),
        ("payments:/a/%2e%2e/b", "'..' segments"),
        ("payments:/./a", "'..' segments"),
        # A backslash is a '/' to WHATWG parsers (Node, proxies) and IIS: /v2/hooks/..\..\x
        # would be /x there; raw it is refused, percent-encoded it ends a segment.
        ("payments:/..\\..\\admin", "no '#' or backslash"),
        ("payments:/x/..\\/admin", "no '#' or backslash"),
        ("payments:/..%5c..%5cadmin", "'..' segments"),
        ("payments:/a/..%2Fadmin", "'..' segments"),
        # Tomcat, Jetty and Spring drop a segment's ';' parameters before '..' is resolved:
        # /v2/..;/admin is /admin to them.
        ("payments:/..;/admin", "'..' segments"),
        ("payments:/a/..;/..;/admin", "'..' segments"),
        ("payments:/%2e%2e;/admin", "'..' segments"),
        ("payments:/..;jsessionid=x/admin", "'..' segments"),
        ("payments:/..%3b/admin", "'..' segments"),
        ("payments:/.;x/admin", "'..' segments"),
        ("payments://evil.example/x", "not http or https"),
        ("payments:/a b", "visible ASCII"),
        ("payments:/a#b", "no '#'"),
        ("payments:/a\r\nb", "visible ASCII"),
        ("https://hooks.example.com/a\r\nHost: x", "control character"),
        ("https://hooks.example.com/caf\u00e9", "non-ASCII character: percent-encode"),
        ("https://hooks.example.com/x?q=\u202e", "non-ASCII character: percent-encode"),
        ("https://h\u00f6oks.example.com/", "xn-- form"),
    ],
)
def test_urls_the_policy_refuses_never_become_jobs(url, rule_or_text):
    with pytest.raises(ValueError, match=rule_or_text.replace("(", r"\(").replace(".", r"\.")):
        schedule_http(url, in_=10)
    assert not Job.objects.exists()


def test_an_unknown_destination_is_named_without_its_token():
    with pytest.raises(ValueError, match="names no destination") as refused:
        schedule_http("nowhere:/x?token=s3cret-t0ken", in_=10)
    assert "s3cret-t0ken" not in str(refused.value)


def test_a_path_parameter_on_an_ordinary_segment_is_kept():
    job = schedule_http("payments:/a;v=1/..x/b;c", in_=10)
    assert job.kwargs["path"] == "/a;v=1/..x/b;c"


def test_a_form_number_too_long_to_write_is_invalid_callback_naming_data():
    with pytest.raises(InvalidCallback, match="form cannot be written") as info:
        schedule_http("https://hooks.example.com/x", data={"a": 10**5000}, in_=10)
    assert info.value.field == "data"
    assert not Job.objects.exists()


def test_a_key_held_by_a_python_job_is_refused_not_returned_as_the_callback():
    python_job = schedule(tasks.record, in_=60, args=["private"], key="order-42")
    with pytest.raises(KeyHeld, match="not a callback") as info:
        schedule_http("https://hooks.example.com/x", in_=10, key="order-42")
    assert info.value.job.pk == python_job.pk
    assert list(Job.objects.values_list("pk", flat=True)) == [python_job.pk]


def test_a_url_that_is_not_a_str_is_a_type_error():
    with pytest.raises(TypeError):
        schedule_http(None, in_=1)  # type: ignore[arg-type]


def test_an_empty_allowlist_means_no_callbacks_at_all(settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "HTTP_ALLOWED_HOSTS": [],
                          "HTTP_DESTINATIONS": {}}  # fmt: skip
    with pytest.raises(ValueError, match="empty: no callbacks are allowed"):
        schedule_http("https://hooks.example.com/", in_=1)


def test_the_door_checks_an_address_in_the_url_and_resolves_no_name(settings):
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": ["127.0.0.1", "hooks.example.com"],
    }
    with pytest.raises(ValueError, match=r"127\.0\.0\.1 is loopback"):
        schedule_http("https://127.0.0.1/", in_=1)

    def resolver(host: str, port: int) -> list[policy.IPAddress]:
        raise AssertionError("schedule_http resolved a name")

    # The name's addresses are checked at delivery, which must check them anyway: a lookup
    # here would wait for the resolver inside the caller's transaction.
    with policy.use_resolver(resolver):
        assert schedule_http("https://hooks.example.com/", in_=1).pk


# -- settings checks ----------------------------------------------------------------------------


def ids(settings, **http) -> list[str]:
    settings.DELAYJOBS = {"REDIS_URL": "redis://x/0", **http}
    return [error.id for error in check_settings()]


def test_a_good_http_configuration_passes(settings):
    assert ids(settings, HTTP_ALLOWED_HOSTS=["a.example"], HTTP_SIGNING_SECRETS=[SECRET],
               HTTP_DESTINATIONS={"a": {"url": "https://a.example/x", "headers": {"X": "1"},
                                        "signing_secrets": [new_secret()]}}) == []  # fmt: skip


@pytest.mark.parametrize(
    ("http", "expected"),
    [
        ({"HTTP_SIGNING_SECRETS": ["not-a-secret"]}, "E009"),
        ({"HTTP_SIGNING_SECRETS": ["whsec_c2hvcnQ="]}, "E009"),
        ({"HTTP_SIGNING_SECRETS": "whsec_x"}, "E009"),
        ({"HTTP_ALLOWED_HOSTS": ["http://a.example"]}, "E009"),
        ({"HTTP_ALLOWED_HOSTS": ["*"]}, "E009"),
        ({"HTTP_ALLOWED_HOSTS": "a.example"}, "E009"),
        ({"HTTP_ALLOW_PRIVATE_NETWORKS": "yes"}, "E006"),
        ({"HTTP_DESTINATIONS": {"a": "https://a.example"}}, "E009"),
        ({"HTTP_DESTINATIONS": {"a": {"url": "https://a.example", "token": "x"}}}, "E009"),
        ({"HTTP_DESTINATIONS": {"a": {"headers": {}}}}, "E009"),
        ({"HTTP_DESTINATIONS": {"A b": {"url": "https://a.example"}}}, "E009"),
        ({"HTTP_DESTINATIONS": {"https": {"url": "https://a.example"}}}, "E009"),
        ({"HTTP_DESTINATIONS": {"a": {"url": "ftp://a.example"}}}, "E009"),
        ({"HTTP_DESTINATIONS": {"a": {"url": "https://a.example/?q=1"}}}, "E009"),
        ({"HTTP_DESTINATIONS": {"a": {"url": "https://a.example", "headers": {"H": "a\nb"}}}},
         "E009"),
        ({"HTTP_DESTINATIONS": {"a": {"url": "https://a.example", "signing_secrets": ["x"]}}},
         "E009"),
        ({"HTTP_DESTINATIONS": {"a": {"url": "https://b.example"}},
          "HTTP_ALLOWED_HOSTS": ["a.example"], "HTTP_SIGNING_SECRETS": [SECRET]}, "E010"),
        ({"HTTP_ALLOWED_HOSTS": ["a.example"]}, "W002"),
        ({"HTTP_RETRY_STATUSES": [503]}, "E009"),
        ({"HTTP_RETRY_STATUSES": [True]}, "E009"),
        ({"HTTP_TIMEOUT_SECONDS": 0}, "E003"),
        ({"HTTP_RESPONSE_KEEP_BYTES": 10**6}, "E004"),
        ({"API_CALLBACK_THROTTLE_RATE": "lots"}, "E009"),
        ({"API_CALLBACK_PERMISSIONS": ["add_job"]}, "E009"),
        ({"HTTP_CA_BUNDLE": ""}, "E009"),
    ],
)  # fmt: skip
def test_bad_http_settings_are_check_errors(settings, http, expected):
    assert f"django_delayjobs.{expected}" in ids(settings, **http)


def test_an_http_ca_bundle_that_cannot_be_loaded_is_a_check_error(settings, tmp_path, tls_ca):
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("not a certificate\n")
    assert "django_delayjobs.E014" in ids(settings, HTTP_CA_BUNDLE=str(tmp_path / "missing.pem"))
    assert "django_delayjobs.E014" in ids(settings, HTTP_CA_BUNDLE=str(not_pem))
    assert "django_delayjobs.E014" not in ids(settings, HTTP_CA_BUNDLE=tls_ca[1])


def test_without_urllib3_callbacks_are_refused_and_check_says_why(settings, monkeypatch):
    from django_delayjobs.callbacks import action
    from django_delayjobs.exceptions import ConfigurationError

    monkeypatch.setattr(action, "client_installed", lambda: False)
    with pytest.raises(ConfigurationError, match=r"django-delayjobs\[http\]: pip install urllib3"):
        schedule_http("https://hooks.example.com/", in_=1)
    assert not Job.objects.exists()
    assert "django_delayjobs.E011" in ids(settings, HTTP_ALLOWED_HOSTS=["a.example"])


def test_the_signing_module_needs_no_django():
    import subprocess
    import sys

    code = (
        "import sys; from django_delayjobs.callbacks.signing import sign, verify, new_secret; "
        "s = new_secret(); h = sign('id', b'x', [s]); assert verify(h, b'x', [s]) == 'id'; "
        "assert not [m for m in sys.modules if m.split('.')[0] == 'django'], 'django imported'"
    )
    env = {"PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
