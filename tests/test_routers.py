"""A project whose database router sends reads to a replica (Django's documented
primary/replica pattern): the package reads its rows, and the targets of its jobs, where
it writes them. Here the replica has the tables and the content types, and none of the
rows this test writes, as a replica that has not caught up: every read that went there
would miss what was just written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import run_in_web_process

pytestmark = pytest.mark.django_db(transaction=True)

PROGRAM = """
import json
from datetime import timedelta

import django

django.setup()
from django.core.management import call_command

call_command("migrate", database="replica", verbosity=0)
from django.contrib.contenttypes.models import ContentType

# A replica is a copy: the content types the primary had before this run, with its ids.
ContentType.objects.using("replica").all().delete()
ContentType.objects.using("replica").bulk_create(ContentType.objects.using("default").all())

from django_delayjobs import cancel_for, schedule, services
from django_delayjobs.execution import Execution
from django_delayjobs.models import Job, JobEvent
from tests.testapp import tasks
from tests.testapp.models import Thing

found = {}
hour = timedelta(hours=1)
first = schedule(tasks.record, args=["a"], in_=hour, key="k")
found["the key's holder"] = schedule(tasks.record, args=["a"], in_=hour, key="k").pk == first.pk
thing = Thing.objects.create()
schedule(thing.expire, in_=hour)
found["cancel_for"] = cancel_for(thing, Thing.expire)
job = schedule(Thing.objects.create().expire, in_=timedelta(0))
found["a new target's job"] = Execution(job.queue, str(job.pk), "w").run().outcome.value
dead = schedule(tasks.fail, in_=timedelta(0), max_attempts=1)
Execution(dead.queue, str(dead.pk), "w").run()
found["requeue"] = services.requeue(dead)
event = JobEvent.objects.filter(job=dead).first()
found["event.job"] = event is not None and event.job.pk == dead.pk
found["job.events"] = dead.events.count()
found["replica rows"] = Job.objects.using("replica").count()
print(json.dumps(found))
"""


def test_reads_go_where_the_writes_go(redis_url: str, tmp_path: Path) -> None:
    env = {"DELAYJOBS_TEST_REPLICA": str(tmp_path / "replica.sqlite3")}
    done = run_in_web_process(PROGRAM, redis_url=redis_url, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-5000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {
        "the key's holder": True,
        "cancel_for": 1,
        "a new target's job": "succeeded",
        "requeue": True,
        "event.job": True,
        "job.events": 5,  # scheduled, started, failed, dead, requeued
        "replica rows": 0,  # the replica never caught up: nothing was read from it
    }
