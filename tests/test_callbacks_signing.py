"""Standard Webhooks signing and verifying, checked against the specification's published
vector and its reference library (``standardwebhooks``), in both directions."""

from __future__ import annotations

import base64
import time
from datetime import UTC

import pytest
import standardwebhooks
from hypothesis import given, settings
from hypothesis import strategies as st

from django_delayjobs.callbacks.signing import (
    MAX_SIGNATURES,
    InvalidSecret,
    InvalidSignature,
    new_secret,
    secret_key,
    sign,
    signature,
    verify,
)

# The Standard Webhooks specification's test vector.
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TIMESTAMP = 1614265330
SPEC_BODY = b'{"test": 2432232314}'
SPEC_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_signature_matches_the_specification_vector():
    assert signature(SPEC_SECRET, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY) == SPEC_SIGNATURE
    headers = {"Webhook-Id": SPEC_ID, "Webhook-Timestamp": str(SPEC_TIMESTAMP),
               "Webhook-Signature": SPEC_SIGNATURE}  # fmt: skip
    assert verify(headers, SPEC_BODY, [SPEC_SECRET], now=SPEC_TIMESTAMP + 10) == SPEC_ID


def test_the_reference_library_verifies_what_we_sign_and_we_verify_what_it_signs():
    secret, body = new_secret(), '{"order":42,"note":"caf\u00e9"}'.encode()
    ours = sign("0d4f6a52-job", body, [secret])
    assert standardwebhooks.Webhook(secret).verify(body, ours) == {"order": 42, "note": "café"}
    now = int(time.time())
    from datetime import datetime

    theirs = standardwebhooks.Webhook(secret).sign(
        "msg_1", datetime.fromtimestamp(now, tz=UTC), body.decode()
    )
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(now), "webhook-signature": theirs}
    assert verify(headers, body, [secret]) == "msg_1"


def test_every_secret_signs_so_a_receiver_holding_any_one_of_them_verifies():
    old, new = new_secret(), new_secret()
    body = b"{}"
    headers = sign("id-1", body, [new, old])
    stamp = int(headers["webhook-timestamp"])
    assert headers["webhook-signature"] == (
        f"{signature(new, 'id-1', stamp, body)} {signature(old, 'id-1', stamp, body)}"
    )
    assert verify(headers, body, [old, new]) == "id-1"  # a receiver rotating keys
    assert verify(headers, body, [new]) == "id-1"  # a receiver already updated
    assert verify(headers, body, [old]) == "id-1"  # a receiver not yet updated
    for secret in (new, old):  # the reference library takes the list too
        assert standardwebhooks.Webhook(secret).verify(body, headers) == {}
    with pytest.raises(InvalidSignature, match="no webhook-signature matches"):
        verify(headers, body, [new_secret()])


def test_at_most_max_signatures_are_sent():
    secrets = [new_secret() for _ in range(MAX_SIGNATURES + 1)]
    headers = sign("id-1", b"x", secrets[:-1], timestamp=5)
    assert len(headers["webhook-signature"].split(" ")) == MAX_SIGNATURES
    with pytest.raises(InvalidSecret, match=f"at most {MAX_SIGNATURES}"):  # none left out
        sign("id-1", b"x", secrets, timestamp=5)


def test_without_secrets_no_signature_header_is_sent():
    headers = sign("id-1", b"x", [], timestamp=5)
    assert headers == {"webhook-id": "id-1", "webhook-timestamp": "5"}


@pytest.mark.parametrize(
    "tamper",
    [
        lambda h, b: (h, b + b" "),
        lambda h, b: (h, b.replace(b"42", b"43")),
        lambda h, b: ({**h, "webhook-id": "other"}, b),
        lambda h, b: ({**h, "webhook-timestamp": str(int(h["webhook-timestamp"]) + 1)}, b),
        lambda h, b: ({**h, "webhook-signature": h["webhook-signature"][:-4] + "AAA="}, b),
        lambda h, b: ({**h, "webhook-signature": "v2," + h["webhook-signature"][3:]}, b),
    ],
)
def test_any_tampering_is_detected(tamper):
    secret, body = new_secret(), b'{"order":42}'
    headers, body = tamper(sign("job-1", body, [secret]), body)
    with pytest.raises(InvalidSignature):
        verify(headers, body, [secret])


def test_timestamp_tolerance_both_ways():
    secret, body = new_secret(), b""
    headers = sign("job-1", body, [secret], timestamp=1_000_000)
    assert verify(headers, body, [secret], now=1_000_000 + 300) == "job-1"
    with pytest.raises(InvalidSignature, match="too old"):
        verify(headers, body, [secret], now=1_000_000 + 301)
    with pytest.raises(InvalidSignature, match="future"):
        verify(headers, body, [secret], now=1_000_000 - 301)
    assert verify(headers, body, [secret], now=1_000_000 + 3000, tolerance=3600) == "job-1"


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"webhook-id": "a", "webhook-timestamp": "1"},
        {"webhook-id": "", "webhook-timestamp": "1", "webhook-signature": "v1,AAAA"},
        {"webhook-id": "a b", "webhook-timestamp": "1", "webhook-signature": "v1,AAAA"},
        {"webhook-id": "a", "webhook-timestamp": "-1", "webhook-signature": "v1,AAAA"},
        {"webhook-id": "a", "webhook-timestamp": "1e9", "webhook-signature": "v1,AAAA"},
        {"webhook-id": "a", "webhook-timestamp": "9" * 400, "webhook-signature": "v1,AAAA"},
        {"webhook-id": "a", "webhook-timestamp": "1", "webhook-signature": "v1"},
        {"webhook-id": "a", "webhook-timestamp": "1", "webhook-signature": "v1,***"},
        {"webhook-id": "a", "webhook-timestamp": "1", "webhook-signature": ",,, ,"},
        {"webhook-id": 5, "webhook-timestamp": "1", "webhook-signature": "v1,AAAA"},
    ],
)
def test_malformed_headers_raise_invalid_signature_only(headers):
    with pytest.raises(InvalidSignature):
        verify(headers, b"", [new_secret()], now=1)


@settings(max_examples=200, deadline=None)  # the answer, not its speed on a loaded machine
@given(
    st.dictionaries(
        st.sampled_from(["webhook-id", "webhook-timestamp", "webhook-signature", "x"]),
        st.text(max_size=60),
    ),
    st.binary(max_size=40),
)
def test_no_header_value_makes_verify_raise_anything_else(headers, body):
    with pytest.raises(InvalidSignature):
        verify(headers, body, [SPEC_SECRET])


@pytest.mark.parametrize(
    "secret",
    ["", "whsec_", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_not base64!", "whsec_c2hvcnQ=",
     "whsec_" + base64.b64encode(b"x" * 65).decode(), None, 42],
)  # fmt: skip
def test_bad_secrets_are_refused(secret):
    with pytest.raises(InvalidSecret):
        secret_key(secret)


def test_secrets_without_padding_are_read():
    key = b"k" * 32
    unpadded = "whsec_" + base64.b64encode(key).decode().rstrip("=")
    assert secret_key(unpadded) == key
    assert len(secret_key(new_secret())) == 32
