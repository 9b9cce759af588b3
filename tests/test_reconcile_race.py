"""Reconcile reads the waiting rows, then adds their ids to Redis. A worker may finish a
job in between (and ack its id): the sweep must not put that id back, nor count it."""

from __future__ import annotations

import pytest

from django_delayjobs.connection import get_engine
from django_delayjobs.engine import Engine
from django_delayjobs.models import Job, Status
from django_delayjobs.reconcile import reconcile
from django_delayjobs.services import build_job, schedule_many
from tests.helpers import age_rows
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


class FinishingFirst(Engine):
    """An engine whose add lets "a worker" finish some jobs just before it runs."""

    finish: list[Job]

    def add(self, queue, items, priorities=None, **options):  # type: ignore[no-untyped-def]
        Job.objects.filter(pk__in=[j.pk for j in self.finish]).update(status=Status.SUCCEEDED)
        return super().add(queue, items, priorities, **options)


def test_a_job_finished_between_the_read_and_the_add_is_not_put_back(redis_client):
    jobs = schedule_many([build_job(tasks.record, in_=60, args=[str(n)]) for n in range(6)])
    age_rows()
    redis_client.flushdb()  # Redis lost them all
    engine = FinishingFirst(get_engine().client, prefix=get_engine().prefix)
    engine.finish = jobs[:2]
    assert reconcile(engine) == {"default": 4}  # the four still waiting
    held = {i for i, _ in engine.next_due("default", 10)}
    assert held == {str(j.pk) for j in jobs[2:]}
