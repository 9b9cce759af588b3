"""Helpers shared by the REST API tests (no tests here): users, clients, jobs in a state."""

from __future__ import annotations

import ipaddress
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.cache import cache
from django.core.management import call_command
from rest_framework.test import APIClient

from django_delayjobs.callbacks import policy
from django_delayjobs.callbacks.signing import new_secret
from django_delayjobs.connection import get_engine
from django_delayjobs.models import Job, Status
from django_delayjobs.services import build_job, schedule_many
from tests.testapp import tasks

API = "/api/delayjobs/"


def url(*parts: object) -> str:
    return API + "".join(f"{part}/" for part in parts)


def make_user(name: str = "ada", *, staff: bool = True, superuser: bool = False,
              perms: tuple[str, ...] = ()) -> User:  # fmt: skip
    user = User.objects.create_user(name, password="pw", is_staff=staff, is_superuser=superuser)
    for codename in perms:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="django_delayjobs", codename=codename)
        )
    return user


def client_for(user: User | None, *, csrf: bool = False) -> APIClient:
    client = APIClient(enforce_csrf_checks=csrf)
    if user is not None:
        client.force_login(user)
    return client


def burst() -> None:
    """Run what is due now in this process, as ``run_delayworker --burst`` does."""
    call_command("run_delayworker", "--burst", "-v", "0")


def dead_job(job_id: uuid.UUID | None = None) -> Job:
    """A job that failed its only attempt, run by a real (in-process) worker."""
    job = build_job(tasks.fail, in_=0, max_attempts=1)
    if job_id is not None:
        job.id = job_id
    schedule_many([job])
    burst()
    job.refresh_from_db()
    assert job.status == Status.DEAD
    return job


def running(job: Job) -> Job:
    """Mark a job as claimed by a worker (what the worker's conditional UPDATE does)."""
    Job.objects.filter(pk=job.pk).update(status=Status.RUNNING, attempts=1)
    job.refresh_from_db()
    return job


def due_in_redis(job: Job) -> float | None:
    """The due time (ms, to the microsecond) Redis holds for a pending job, or None."""
    engine = get_engine()
    shard = engine.home(job.queue, str(job.pk))  # the queue itself, unless it has shards
    return engine.client.zscore(engine.keys(shard).pending, str(job.pk))


def redis_state(job: Job) -> str | None:
    """Where the engine holds a job id, if anywhere."""
    engine, jid = get_engine(), str(job.pk)
    keys, client = engine.keys(engine.home(job.queue, jid)), engine.client
    for name in ("pending", "unack", "garbage"):
        if client.zscore(getattr(keys, name), jid) is not None:
            return name
    return "ready" if client.lpos(keys.ready, jid) is not None else None


def events(job: Job) -> list[tuple[str, str]]:
    return list(job.events.values_list("kind", "actor"))


def snapshot(job: Job) -> dict[str, Any]:
    """What a rejected request must leave exactly as it was."""
    row = Job.objects.values().get(pk=job.pk)
    return {**row, "events": job.events.count(), "redis": due_in_redis(job)}


@pytest.fixture
def http(settings: Any) -> Iterator[Any]:
    """Callbacks to hooks.example.com allowed (resolved to a public address, never
    reached), signed, unthrottled; the settings fixture."""
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": ["hooks.example.com"],
        "HTTP_SIGNING_SECRETS": [new_secret()],
        "API_CALLBACK_THROTTLE_RATE": None,
    }
    cache.clear()
    with policy.use_resolver(lambda host, port: [ipaddress.ip_address("93.184.215.14")]):
        yield settings
