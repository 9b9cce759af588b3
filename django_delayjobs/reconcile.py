"""Repair Redis from the database: every waiting job must be held by the engine.

Redis may lose everything (a restart without persistence, FLUSHALL, failover) or miss an
add (it was down when a schedule committed). The database is the record, so this sweep
re-adds what Redis does not hold. Adding is idempotent, so sweeps may overlap.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from datetime import timedelta

from django.db.models import Q
from django.utils import timezone

from . import timing
from .conf import delayjobs_settings
from .engine import Engine
from .models import WAITING, Job, Status

logger = logging.getLogger("django_delayjobs.reconcile")

CHUNK = 1000


def reconcile(engine: Engine, *, horizon: timedelta | None = None) -> Counter[str]:
    """Re-add waiting jobs due within ``horizon`` (all of them when None); count per queue.

    Also re-adds ``running`` jobs whose lease should long have ended, in case Redis lost
    them together with their worker; ``add`` skips any that Redis still holds in flight.
    """
    now = timezone.now()
    lease = timedelta(seconds=delayjobs_settings.LEASE_SECONDS)
    due = Q(status__in=WAITING)
    if horizon is not None:
        due &= Q(run_at__lte=now + horizon)
    stuck = Q(status=Status.RUNNING, started_at__lt=now - lease)
    rows = Job.objects.filter(due | stuck).values_list("pk", "queue", "run_at")
    repaired: Counter[str] = Counter()
    batch: dict[str, dict[str, int]] = defaultdict(dict)
    for pk, queue, run_at in rows.order_by().iterator(chunk_size=CHUNK):
        batch[queue][str(pk)] = timing.to_ms(run_at)
        if len(batch[queue]) >= CHUNK:
            repaired[queue] += _repair(engine, queue, batch.pop(queue))
    for queue, items in batch.items():
        repaired[queue] += _repair(engine, queue, items)
    if sum(repaired.values()):  # a Counter holding zeros is truthy
        logger.warning("reconcile re-added %s job(s) Redis did not hold: %s",
                       sum(repaired.values()), dict(repaired))  # fmt: skip
    return repaired


def _repair(engine: Engine, queue: str, items: dict[str, int]) -> int:
    # A waiting job found in garbage was requeued while Redis was unreachable.
    revived = engine.requeue(queue, list(items))
    return revived + len(engine.add(queue, items))


def horizon() -> timedelta:
    return timedelta(seconds=delayjobs_settings.RECONCILE_HORIZON_SECONDS)
