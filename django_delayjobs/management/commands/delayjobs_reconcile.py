"""``manage.py delayjobs_reconcile``: a full database -> Redis repair pass."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError
from django.db import Error as DatabaseError

from ...connection import get_engine
from ...databases import database_error, jobs_alias
from ...engine import DelayJobsError, PartlyUnavailable
from ...reconcile import Reconciled, reconcile
from ..output import SafeOutputCommand


class Command(SafeOutputCommand):
    help = (
        "Re-add every waiting or running job that Redis does not hold, and take the ids of "
        "jobs that are not dead out of Redis's garbage (after data loss in Redis, or a "
        "restore from an older snapshot)."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        repaired = Reconciled()
        try:
            engine = get_engine()
            reconcile(engine, horizon=None, into=repaired)
            # A pass with no waiting row asks Redis nothing: it would report "repaired 0"
            # for a Redis that is down or refuses writes, the state it is run to repair.
            # Asked after the pass, so that a Cluster master down stops no other's repair.
            refused = engine.refused_write()
        except PartlyUnavailable as exc:  # what it did before Redis failed, then why
            if isinstance(exc.done, Reconciled):
                self.report(exc.done)
            raise CommandError(str(exc)) from exc
        except DelayJobsError as exc:
            raise CommandError(str(exc)) from exc
        except DatabaseError as exc:  # what it did before the database failed, if anything
            if repaired:
                self.report(repaired)
            raise CommandError(database_error(exc, jobs_alias())) from exc
        if refused is not None:
            address, refusal = refused
            where = f" (master {address})" if address else ""
            raise CommandError(f"Redis refuses writes{where}: {refusal}")
        self.report(repaired)

    def report(self, repaired: Reconciled) -> None:
        for queue, count in sorted(repaired.items()):
            self.stdout.write(f"{queue}: re-added {count} job(s)")
        self.stdout.write(f"repaired {sum(repaired.values())} job(s)")
        for queue, count in sorted((+repaired.cleared).items()):
            self.stdout.write(f"{queue}: took {count} id(s) out of garbage whose job is not dead")
        for pk, why in repaired.unusable.items():
            self.stdout.write(f"{pk}: due time unusable ({why}); handed to a worker due now")
        for pk, why in repaired.skipped.items():
            self.stdout.write(f"{pk!r}: skipped ({why})")
