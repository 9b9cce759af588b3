"""Follow-ups of today's reviews: a credential cut in two by the quote of a failure, and
what the reconcile and prune commands say when they stop partway.

Every delivery here goes to a real server on 127.0.0.1, run by a real (in-process,
``--burst``) worker."""

from __future__ import annotations

import logging

import pytest

from django_delayjobs import schedule_http
from django_delayjobs.models import Status
from tests.test_audit_sec import TOKEN, allow, burst, shown

pytestmark = pytest.mark.django_db(transaction=True)


# -- 1. a token the cut of a quoted failure splits ------------------------------------------------


def test_a_url_token_split_by_the_cut_of_a_quoted_failure_is_masked(
    raw_server, settings, redis_client, caplog
):
    """A status line that echoes the request line is quoted up to 200 characters: the
    masking came after the cut, so a token that straddled character 200 was no longer
    whole, not masked, and its first part stayed in the job's error, history and log."""

    def echo(conn) -> None:
        conn.sendall(server.requests[-1])

    server = raw_server(echo)
    allow(settings, server)
    # The quote is "POST /hook/<pad>?token=<TOKEN> HTTP/1.1": the token starts at 190.
    pad = "p" * (190 - len("POST /hook/?token="))
    caplog.set_level(logging.INFO)
    job = schedule_http(f"{server.url('/hook/' + pad)}?token={TOKEN}", in_=0, max_attempts=1)
    burst()
    job.refresh_from_db()
    assert job.status == Status.DEAD and "no answer (network)" in job.last_error
    assert "?token=***... (" in job.last_error  # the cut start masked, the cut said
    logged = [record.getMessage() for record in caplog.records]
    texts = [job.last_error, *job.events.values_list("message", flat=True), *shown(job), *logged]
    assert any(pad in text for text in logged)  # the log does quote the failure
    for text in texts:
        assert TOKEN[:6] not in text
