"""Security audit (second pass) of what the admin, the API and a callback's history show:
a ``?token=`` of a callback's URL that its receiver echoes back.

Every delivery here goes to a real server on 127.0.0.1, run by a real (in-process,
``--burst``) worker; every page is read through Django's test client or DRF's."""

from __future__ import annotations

import pytest

from django_delayjobs import schedule_http
from django_delayjobs.models import Status
from tests.callback_server import Reply
from tests.test_audit_sec import TOKEN, allow, burst, shown

pytestmark = pytest.mark.django_db(transaction=True)


# -- a receiver that echoes the URL does not put its token in the job ---------------------------


@pytest.mark.parametrize(("status", "ends"), [(404, Status.DEAD), (200, Status.SUCCEEDED)])
@pytest.mark.parametrize("named", [False, True], ids=["url", "destination"])
def test_a_url_token_the_receiver_echoes_is_masked_in_the_jobs_result_and_history(
    status, ends, named, callback_server, settings, redis_client
):
    """The admin and the API show a callback's URL with ``?token=***``; a receiver that
    quotes the URL it was asked for (a 404 page, a debug echo, a redirect) put the token
    back, whole, in the job's error, history and result, beside the masked URL."""
    hooks = {"hooks": {"url": callback_server.url("/base")}}
    allow(settings, callback_server, HTTP_DESTINATIONS=hooks)
    echo = f"The requested URL /hook?token={TOKEN}&order=42 was not found".encode()
    for path in ("/hook", "/base/hook"):
        callback_server.script(path, Reply(status, echo, headers={"Location": f"/x?t={TOKEN}"}))
    where = "hooks:/hook" if named else callback_server.url("/hook")
    job = schedule_http(f"{where}?token={TOKEN}&order=42", in_=0, max_attempts=1)
    burst()
    assert callback_server.wait_for(1)[0].path.endswith(f"?token={TOKEN}&order=42")  # as given
    job.refresh_from_db()
    assert job.status == ends
    kept = [str(job.result), job.last_error, *job.events.values_list("message", flat=True)]
    for text in kept + shown(job):
        assert TOKEN not in text
    assert "/hook?token=***&order=42 was not found" in "".join(kept)


def test_a_url_token_a_broken_answer_quotes_is_masked_in_the_jobs_error_and_history(
    raw_server, settings, redis_client
):
    """An answer that cannot be read (a server that sends the request back: its request
    line where the status line goes) is quoted in the failure's history line and error,
    which kept the URL's ``?token=`` whole beside the masked URL."""

    def echo(conn) -> None:
        conn.sendall(server.requests[-1])

    server = raw_server(echo)
    allow(settings, server)
    job = schedule_http(f"{server.url('/hook')}?token={TOKEN}", in_=0, max_attempts=1)
    burst()
    job.refresh_from_db()
    assert job.status == Status.DEAD and "no answer (network)" in job.last_error
    for text in [job.last_error, *job.events.values_list("message", flat=True), *shown(job)]:
        assert TOKEN not in text
    assert "/hook?token=*** HTTP/1.1" in job.last_error
