"""What a hostile value can do to the logs: forge a worker's line with control characters
or ANSI escapes, or show a secret that redis-py would read from a URL."""

from __future__ import annotations

import logging
import time

import pytest
from django.core.management import call_command

from django_delayjobs import schedule, schedule_http
from django_delayjobs.callbacks.signing import new_secret
from django_delayjobs.conf import describe, validate
from django_delayjobs.connection import cluster_url_problem
from django_delayjobs.redact import without_userinfo
from tests.callback_server import Reply
from tests.testapp import tasks

SECRET = "s3cret"


@pytest.mark.parametrize(
    "url",
    [
        "redis://h:6379/0?pass%77ord=s3cret",  # redis-py decodes the names (parse_qs)
        "redis://h:6379/0?%70assword=s3cret",
        "https://hooks.example/in?client_secret=s3cret",
        "https://hooks.example/in?x-api-key=s3cret",
        "https://hooks.example/in?private_token=s3cret",
        "https://hooks.example/in?access-token=s3cret",
    ],
)
def test_a_credential_query_value_is_masked_whatever_its_name_is_spelled(url):
    assert SECRET not in without_userinfo(url)


@pytest.mark.parametrize("hostile", ["?" * 200_000, "?a" * 100_000, "a:" * 100_000 + "@"])
def test_masking_a_huge_hostile_value_takes_linear_time(hostile):
    started = time.perf_counter()
    shown = without_userinfo(hostile + "&token=s3cret")
    assert time.perf_counter() - started < 1.0  # linear: ~20 ms; quadratic: minutes
    assert SECRET not in shown


def test_a_cluster_url_problem_shows_no_percent_encoded_password():
    problem = cluster_url_problem("redis://h:6379/1?pass%77ord=s3cret")
    assert problem is not None and "database other than 0" in problem
    assert SECRET not in problem


FORGED = "\x1b[2K\r2026-01-01 00:00:00,000 WARNING django_delayjobs.worker: job x: succeeded"


@pytest.mark.django_db(transaction=True)
def test_a_failure_message_cannot_forge_a_worker_log_line(caplog):
    message = f"boom{FORGED}\u2028{FORGED}"  # raised as it is (no row holds it: PostgreSQL)
    schedule(tasks.raise_text, args=[message.encode("unicode_escape").decode()], in_=0,
             max_attempts=1)  # fmt: skip
    caplog.set_level(logging.INFO, logger="django_delayjobs")
    call_command("run_delayworker", "--burst", "-v", "0")
    text = logging.Formatter("%(levelname)s %(name)s: %(message)s")
    lines = [text.format(r) for r in caplog.records if r.name.startswith("django_delayjobs")]
    dead = [line for line in lines if ": dead (" in line]
    assert len(dead) == 1
    assert dead[0].isprintable()  # no ESC, CR, LF or line separator
    assert "boom\\x1b[2K)" in dead[0]  # shown escaped, not dropped


@pytest.mark.django_db(transaction=True)
def test_a_callback_urls_token_reaches_neither_the_log_nor_the_history(
    settings, redis_client, callback_server, caplog
):
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": [callback_server.netloc],
        "HTTP_ALLOW_PRIVATE_NETWORKS": True,  # the server is on 127.0.0.1
        "HTTP_SIGNING_SECRETS": [new_secret()],
    }
    callback_server.script("/hook", Reply(404, b"no"))
    job = schedule_http(callback_server.url("/hook?token=s3cret"), json={}, in_=0)
    caplog.set_level(logging.INFO, logger="django_delayjobs")
    call_command("run_delayworker", "--burst", "-v", "0")
    job.refresh_from_db()
    assert job.status == "dead" and "?token=***" in job.last_error
    assert [r.path for r in callback_server.requests] == ["/hook?token=s3cret"]  # as given
    dead = [r.getMessage() for r in caplog.records if ": dead (" in r.getMessage()]
    assert len(dead) == 1 and "?token=***" in dead[0]
    assert SECRET not in caplog.text and SECRET not in job.last_error


@pytest.mark.parametrize(
    "setting",
    [
        {"REDIS_URL": b"redis://:s3cret@redis.internal:6379/0"},  # bytes from os.environb
        {"HTTP_SIGNING_SECRETS": "whsec_s3cretS3CRETs3cretS3CRETs3cretS3CRET"},  # not a list
        {"METRICS_TOKEN": b"s3cret-s3cret-s3cret"},
        {"HTTP_DESTINATIONS": [{"Authorization": "s3cret"}]},
    ],
)
def test_a_secret_setting_of_the_wrong_type_is_not_shown_in_its_problem(setting):
    loaded, problems = validate(setting)
    assert loaded is None and len(problems) == 1
    message = describe(problems[0])
    assert "must be" in message and SECRET not in message
