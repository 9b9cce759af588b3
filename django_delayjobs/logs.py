"""Structured logs: ``JsonFormatter`` writes each record as one JSON object on one line.

``run_delayworker --log-format json`` installs it; any project can use it in ``LOGGING``::

    "formatters": {"json": {"()": "django_delayjobs.logs.JsonFormatter"}}

Every line has ``time`` (UTC, ISO 8601), ``level``, ``logger`` and ``message``, and, when
the record is about a job, the fields of ``JOB_FIELDS`` that the worker passes with
``extra=`` (see ``job_fields``). Whatever a value is (a message with newlines, an object
that cannot be turned into JSON or even into a string, a NaN), the line is valid JSON:
the output is ASCII, with every control character escaped.

A text line is one line too: the worker passes every text it did not write itself (an
action's error, a database's message) through ``one_line``, so that no CR, LF or ANSI
escape in it can end the line or forge one that reads like the worker's own.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .models import Job

#: Record attributes copied into a line when present (passed with ``extra=``).
JOB_FIELDS = ("job_id", "queue", "action", "attempt", "outcome", "lateness_ms")


def _plain(value: Any) -> Any:
    """A JSON-safe version of one value (strings, finite numbers, booleans, None)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    try:
        return str(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


def one_line(text: str) -> str:
    """``text`` fit for one text log line: each character that is not printable (control
    characters, so CR, LF and the ESC of ANSI sequences; line separators; lone surrogates,
    which a UTF-8 log file cannot encode; bidi controls) written as ``repr`` writes it."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": self.message(record),
        }
        for name in JOB_FIELDS:
            if name in record.__dict__:
                entry[name] = _plain(record.__dict__[name])
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=True, default=_plain)

    @staticmethod
    def message(record: logging.LogRecord) -> str:
        """The formatted message; a message whose arguments do not fit is shown as is."""
        try:
            return str(record.getMessage())
        except Exception:
            try:
                return f"{record.msg!r} % {record.args!r}"
            except Exception:
                return "<unprintable message>"


def job_fields(job_id: object, queue: str, job: Job | None = None,
               outcome: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The ``extra=`` of a log call about a job. Reads only fields the row has loaded (a
    log line never queries the database)."""
    from .engine import queue_of

    with contextlib.suppress(TypeError, ValueError):
        queue = queue_of(queue)  # a shard's name (orders#2/6): its queue's
    fields: dict[str, Any] = {"job_id": str(job_id), "queue": queue}
    if outcome is not None:
        fields["outcome"] = outcome
    if job is None:
        return fields
    loaded = job.__dict__
    if "action" in loaded:
        fields["action"] = loaded["action"]
    if "attempts" in loaded:
        fields["attempt"] = loaded["attempts"]
    started, due = loaded.get("started_at"), loaded.get("run_at")
    if isinstance(started, datetime.datetime) and isinstance(due, datetime.datetime):
        fields["lateness_ms"] = round((started - due).total_seconds() * 1000, 1)
    return fields


def use_json(logger: logging.Logger) -> None:
    """Make ``logger`` write JSON lines: its handlers (a stderr one if it has none) get a
    ``JsonFormatter``, and its records no longer reach the root's handlers."""
    if not logger.handlers:
        logger.addHandler(logging.StreamHandler())
    for handler in logger.handlers:
        handler.setFormatter(JsonFormatter())
    logger.propagate = False
