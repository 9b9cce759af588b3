"""``schedule_http`` and finding a callback job by key: what user code and the API call."""

from __future__ import annotations

from typing import Any

from .. import door
from ..conf import delayjobs_settings
from ..exceptions import InvalidSchedule
from ..models import ACTIVE, Job
from ..rows import tolerant
from ..services import build_job, submit
from . import config
from .action import ACTION, deliver, require_client
from .request import build


class KeyHeld(InvalidSchedule):
    """The key is held by an active job that is not a callback: no callback is scheduled,
    and that job is not answered as if it were one. ``job`` is the holder."""

    def __init__(self, job: Job) -> None:
        super().__init__(
            f"the key {job.key!r} of queue {job.queue!r} is held by an active job that is "
            "not a callback"
        )
        self.job = job


def create(
    url: str,
    *,
    method: str = "POST",
    json: Any = None,
    data: Any = None,
    headers: dict[str, str] | None = None,
    in_: Any = None,
    at: Any = None,
    key: str | None = None,
    queue: str | None = None,
    max_attempts: int | None = None,
    expires: Any = None,
    priority: int = 0,
    actor: str = "code",
) -> tuple[Job, bool]:
    """Schedule a callback; return its job and whether it is new (False: the active
    callback job that already holds ``key``). Raise ``KeyHeld`` when the key is held by an
    active job that is not a callback (nothing is written)."""
    require_client()
    request = build(
        url, method=method, json=json, data=data, headers=headers,
        config=config.current(), max_bytes=delayjobs_settings.HTTP_MAX_REQUEST_BYTES,
    )  # fmt: skip
    job = build_job(
        deliver, in_=in_, at=at, kwargs=request.stored(), queue=queue, key=key,
        max_attempts=max_attempts, expires=expires, priority=priority,
    )  # fmt: skip
    stored = submit(job, actor=actor)
    if stored is not job and not is_callback(stored):
        raise KeyHeld(stored)
    return stored, stored is job


def schedule_http(
    url: str,
    *,
    method: str = "POST",
    json: Any = None,
    data: Any = None,
    headers: dict[str, str] | None = None,
    in_: Any = None,
    at: Any = None,
    key: str | None = None,
    queue: str | None = None,
    max_attempts: int | None = None,
    expires: Any = None,
    priority: int = 0,
) -> Job:
    """Schedule a signed HTTP request to ``url`` (or ``"destination:/path"``); return its Job."""
    job, _ = create(
        url, method=method, json=json, data=data, headers=headers, in_=in_, at=at, key=key,
        queue=queue, max_attempts=max_attempts, expires=expires, priority=priority,
    )  # fmt: skip
    return job


def is_callback(job: Job) -> bool:
    return job.action == ACTION and job.target_type_id is None


def active_callback(key: str, queue: str | None = None) -> Job | None:
    """The scheduled, running or retrying callback job holding ``key`` in ``queue``. A key
    or queue that ``schedule_http`` refuses raises as there (None too: a key, not the jobs
    without one), before any query: a NUL is a database error on PostgreSQL."""
    if key is None:
        raise TypeError("key must be a non-empty str (at most 255 characters), not None")
    door.check_key(key)  # what Job.key cannot store as it is raises
    queue = door.check_queue(delayjobs_settings.DEFAULT_QUEUE if queue is None else queue)
    holding = Job.objects.filter(queue=queue, key=key, action=ACTION, status__in=ACTIVE)
    return tolerant(holding).first()  # a poison row too: it holds the key
