"""Structured logs: ``JsonFormatter`` and ``run_delayworker --log-format json``."""

from __future__ import annotations

import json
import logging
import logging.config
import sys
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_delayjobs import schedule
from django_delayjobs.logs import JsonFormatter, job_fields
from django_delayjobs.models import Job
from tests.helpers import burst_worker
from tests.testapp import tasks


def record(msg: object, *args: object, exc: bool = False, **extra: object) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("line one\nline two")
        except ValueError:
            exc_info = sys.exc_info()
    rec = logging.LogRecord("django_delayjobs.worker", logging.WARNING, __file__, 1, msg, args,
                            exc_info)  # fmt: skip
    rec.__dict__.update(extra)
    return rec


def line(rec: logging.LogRecord) -> dict[str, object]:
    text = JsonFormatter().format(rec)
    assert "\n" not in text and "\r" not in text
    assert text.isascii()
    return json.loads(text)


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no")

    __repr__ = __str__


def test_a_plain_line():
    out = line(record("job %s: %s", "abc", "dead", job_id="abc", queue="q", outcome="dead"))
    assert out["message"] == "job abc: dead"
    assert out["level"] == "WARNING" and out["logger"] == "django_delayjobs.worker"
    assert out["time"].endswith("+00:00")
    assert (out["job_id"], out["queue"], out["outcome"]) == ("abc", "q", "dead")
    assert "action" not in out and "attempt" not in out


@pytest.mark.parametrize("hostile", [
    "two\nlines\r\nand\x00nul\u2028sep", "\ud800 lone surrogate", "é ü 中文", '"}{"level":"x',
])  # fmt: skip
def test_hostile_strings_stay_on_one_line(hostile):
    out = line(record(hostile, action=hostile, queue=hostile))
    assert out["message"] == hostile and out["action"] == hostile


def test_values_that_are_not_json():
    out = line(record("m", job_id=Unprintable(), attempt=object(), lateness_ms=float("nan"),
                      outcome=float("inf"), queue=b"bytes", action={1, 2}))  # fmt: skip
    assert out["job_id"] == "<unprintable Unprintable>"
    assert out["attempt"].startswith("<object object")
    assert (out["lateness_ms"], out["outcome"]) == ("nan", "inf")
    assert out["queue"] == "b'bytes'" and out["action"] == "{1, 2}"


def test_messages_that_do_not_format():
    assert line(record("%d items", "x"))["message"] == "'%d items' % ('x',)"
    assert line(record(Unprintable()))["message"] == "<unprintable message>"
    assert line(record("%s", Unprintable()))["message"] == "<unprintable message>"


def test_exceptions_are_one_field():
    out = line(record("failed", exc=True))
    assert out["exc_info"].endswith("ValueError: line one\nline two")


def test_usable_from_logging_config():
    """What ``LOGGING = {"formatters": {"json": {"()": ...}}}`` builds (without touching the
    process's logging configuration)."""
    config = logging.config.DictConfigurator({})
    formatter = config.configure_formatter({"()": "django_delayjobs.logs.JsonFormatter"})
    assert isinstance(formatter, JsonFormatter)
    out = json.loads(formatter.format(record("hello\nworld", job_id="j1")))
    assert (out["message"], out["job_id"]) == ("hello\nworld", "j1")


@pytest.mark.django_db
def test_job_fields_never_query_the_database(django_assert_num_queries):
    job = schedule(tasks.record, args=["x"], in_=timedelta(seconds=60))
    partial = Job.objects.only("id").get(pk=job.pk)
    with django_assert_num_queries(0):
        fields = job_fields(job.pk, "default#1/2", partial, "dead")
    assert fields == {"job_id": str(job.pk), "queue": "default", "outcome": "dead"}
    full = Job.objects.get(pk=job.pk)
    full.started_at = full.run_at + timedelta(milliseconds=12.5)
    assert job_fields(job.pk, "default", full)["lateness_ms"] == 12.5
    assert job_fields(job.pk, "not a queue!")["queue"] == "not a queue!"


def test_log_format_choices_are_checked():
    with pytest.raises(CommandError, match="--log-format"):
        call_command("run_delayworker", "--log-format", "xml")


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_worker_writes_json_lines_with_job_fields(redis_url, tmp_path):
    ok = schedule(tasks.record, args=["fine"], in_=0)
    dead = schedule(tasks.fail, args=["bad\nnews"], in_=0, max_attempts=1)
    log = tmp_path / "w.log"
    assert burst_worker(redis_url, log, "--log-format", "json", "-v", "3") == 0
    lines = [json.loads(t) for t in log.read_text().splitlines() if t.startswith("{")]
    by_job = {(e.get("job_id"), e.get("outcome")): e for e in lines}
    failed = by_job[(str(dead.pk), "dead")]
    assert failed["level"] == "WARNING" and failed["queue"] == "default"
    assert failed["action"] == "tests.testapp.tasks.fail" and failed["attempt"] == 1
    done = by_job[(str(ok.pk), "succeeded")]
    assert done["level"] == "DEBUG" and isinstance(done["lateness_ms"], float)
    # Every line the delayjobs loggers wrote is JSON (the command's own banner is stdout).
    logged = [t for t in log.read_text().splitlines() if "django_delayjobs" in t]
    assert logged and all(t.startswith("{") for t in logged)
