"""What a task's job history says in the task framework's terms (attempts, errors).

A ``TaskResult`` is read from the job's row and its events: who enqueued it and for when
(the ``scheduled`` event), each attempt's worker and start (``started`` events, one per
delivery: an attempt's last delivery counts, not one a ``handed_back`` event undid),
each failure's traceback (``failed``
events). One query per result.
"""

from __future__ import annotations

import datetime
import inspect
import re
import sys
from dataclasses import dataclass
from typing import cast

from .models import EventKind, Job, JobEvent, Status
from .task_api import TaskError

#: The class path of an error that is not an exception the job raised (a cancelled job, a
#: lost worker), and of one whose class this process has not loaded.
DELAYJOBS_ERROR = "django_delayjobs.exceptions.DelayJobsError"
UNKNOWN_ERROR = "builtins.Exception"

_HEADER = re.compile(
    r"(?P<indent>(?:  \+ )?)(?:Exception Group )?Traceback \(most recent call last\):"
)
_CLASS_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_<>][\w<>]*)*")


@dataclass(frozen=True)
class Attempt:
    worker: str
    at: datetime.datetime


@dataclass(frozen=True)
class History:
    actor: str  # who scheduled the job ("django.tasks:<alias>" for a task)
    first_due: datetime.datetime | None  # the due time it was scheduled with
    deferred: bool  # scheduled for later than it was created (a run_after)
    started: list[Attempt]  # one per attempt (not per delivery), oldest first
    failures: list[str]  # the traceback of each failed attempt, oldest first

    @classmethod
    def of(cls, job: Job) -> History:
        kinds = [EventKind.SCHEDULED, EventKind.STARTED, EventKind.FAILED, EventKind.HANDED_BACK]
        # in the order of the changes (see JobEvent's Meta)
        events = JobEvent.objects.filter(job=job, kind__in=kinds).order_by("id")
        actor, first_due = "", None
        started: dict[int, list[Attempt]] = {}  # per attempt, its deliveries' starts
        failures = []
        rows = events.values_list("kind", "actor", "message", "at", "attempt")
        for kind, who, message, at, attempt in rows:
            if kind == EventKind.SCHEDULED and not actor:
                actor, first_due = who, _due(message)
            elif kind == EventKind.STARTED:
                # One per delivery: an attempt delivered again (its worker lost, say) is
                # still one attempt, run by its last delivery's worker.
                started.setdefault(attempt, []).append(Attempt(who.removeprefix("worker:"), at))
            elif kind == EventKind.HANDED_BACK and started.get(attempt):
                started[attempt].pop()  # a claim undone: that delivery never started
            elif kind == EventKind.FAILED:
                failures.append(message)
        created = job.created_at  # an Unreadable (a str) in a corrupt row read tolerantly
        deferred = (
            isinstance(created, datetime.datetime) and first_due is not None and first_due > created
        )
        attempts = [starts[-1] for starts in started.values() if starts]
        return cls(actor, first_due, deferred, attempts, failures)

    @classmethod
    def enqueued(cls, job: Job, actor: str) -> History:
        """The history of ``job``, just scheduled by ``actor``: what ``of`` reads back."""
        return cls(actor, job.run_at, job.run_at > job.created_at, [], [])

    def errors(self, job: Job) -> list[TaskError]:
        """One TaskError per failed attempt, and one for the reason a job ended when that
        was not its last failure (cancelled, its worker lost, its target gone)."""
        errors = [TaskError(exception_class_path=exception_path(text), traceback=text)
                  for text in self.failures]  # fmt: skip
        if job.status == Status.CANCELLED:
            reason = f"the job was {job.status}"  # its last_error is an earlier failure's
        elif job.status in (Status.DEAD, Status.SKIPPED) and self.failures[-1:] != [job.last_error]:
            # (a failure that ends the job writes its text as the job's last error too)
            reason = job.last_error or f"the job was {job.status}"
        else:
            return errors
        errors.append(TaskError(exception_class_path=DELAYJOBS_ERROR, traceback=reason))
        return errors


def _due(message: str) -> datetime.datetime | None:
    """The due time of a ``scheduled`` event ("due <ISO 8601>", as services writes it)."""
    try:
        return datetime.datetime.fromisoformat(message.removeprefix("due ").strip())
    except ValueError:
        return None


def exception_path(traceback_text: str) -> str:
    """Return the class path of the exception a failure's text reports.

    The worker writes it as the text's first line (``builtins.ValueError: boom``, see
    ``execution.describe``), before anything the exception or the action supplied, so
    a message that quotes another traceback cannot change it. A text written before that
    (a bare Python traceback) is read from its last top-level ``Traceback`` header: the
    first unindented line after its frames.

    The path is returned only if it names an exception class this process has already
    loaded: the text comes from the database, and ``TaskError.exception_class`` imports
    what the path names. Otherwise ``builtins.Exception`` (the traceback tells more).
    """
    lines = traceback_text.splitlines()
    path = lines[0].split(": ", 1)[0] if lines else ""
    if "." in path and _CLASS_PATH.fullmatch(path):  # the worker's first line
        return path if _loaded_exception(path) else UNKNOWN_ERROR
    return _legacy_path(lines)


def _legacy_path(lines: list[str]) -> str:
    """The class path a bare formatted traceback reports (the history of older versions)."""
    body, start = "", 0
    for n, line in enumerate(lines):
        header = _HEADER.fullmatch(line)
        if header:
            body, start = header["indent"].replace("+", "|"), n + 1
    for line in lines[start:]:
        if line.startswith(body) and line[len(body) :][:1] not in ("", " "):
            path = line[len(body) :].split(":", 1)[0]
            if "." not in path:  # traceback prints builtins' exceptions without a module
                path = f"builtins.{path}"
            return path if _loaded_exception(path) else UNKNOWN_ERROR
    return UNKNOWN_ERROR


def _loaded_exception(path: str) -> bool:
    """True if ``path`` names a BaseException subclass, found without importing anything
    and without running any code: ``path`` is read from the database, so the walk looks
    only in the ``__dict__`` of loaded modules and classes (``inspect.getattr_static``),
    never through ``getattr``, which would run a module ``__getattr__`` (PEP 562; lazy
    loaders import a submodule of the name asked for), a metaclass's or a property."""
    if not _CLASS_PATH.fullmatch(path):
        return False
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        obj: object = sys.modules.get(".".join(parts[:split]))
        if obj is None:
            continue
        for name in parts[split:]:
            obj = inspect.getattr_static(obj, name, None)
        # type(obj), not isinstance(obj, type): the latter may read a __class__ property
        return issubclass(type(obj), type) and issubclass(cast(type, obj), BaseException)
    return False


__all__ = ["Attempt", "History", "exception_path"]
