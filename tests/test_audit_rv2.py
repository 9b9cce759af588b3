"""Review rv2: bugs found in a fresh-eyes review of reconcile, services and the engine's
readers, each shown against a real Redis before its fix."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from django_delayjobs.connection import get_engine
from django_delayjobs.engine import Engine
from django_delayjobs.models import Job, Status
from django_delayjobs.reconcile import reconcile
from django_delayjobs.services import requeue
from tests.helpers import wait_for
from tests.test_audit_rec import running_long

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_job_requeued_as_reconcile_adopts_its_id_from_garbage_is_not_left_in_flight():
    """Reconcile reads a running row; its attempt then dies (buried) and the admin requeues
    it: the row commits before the requeue's Redis step, and the adopt runs in between,
    taking the id out of garbage. The requeue then finds nothing to move: the id must not
    stay in flight, where no worker runs it and nobody claims it until its lease ends."""
    engine = get_engine()
    job = running_long(engine)
    job_id = str(job.pk)

    class RequeuedFirst(Engine):
        def adopt(self, queue, ids, lease_ms):  # type: ignore[no-untyped-def]
            Job.objects.filter(pk=job.pk).update(status=Status.DEAD, finished_at=timezone.now())
            assert self.bury(queue, [job_id]) == 1  # its worker buried it
            # The requeue's Redis step runs on commit: after this adopt.
            with transaction.atomic():
                assert requeue(job.pk)
                return super().adopt(queue, ids, lease_ms)

    reconcile(RequeuedFirst(engine.client, prefix=engine.prefix), horizon=timedelta(minutes=5))
    assert engine.stats("default").in_flight == 0

    def promoted_and_claimed() -> list[str]:
        engine.promote("default")
        return engine.claim("default", 1)

    assert wait_for(promoted_and_claimed, timeout=5) == [job_id]
