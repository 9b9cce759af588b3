"""Cancel, run now, requeue and purge many jobs: the service calls behind the admin's
actions and the queue page's buttons, and the messages that report what they did.

Every change goes through ``services``; the database decides who wins, so a job that
started or finished meanwhile is counted as too late, not forced.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from django.contrib import messages
from django.contrib.admin.models import DELETION, LogEntry
from django.core import signing
from django.db import DatabaseError, IntegrityError, router, transaction
from django.db.models import ProtectedError, QuerySet, RestrictedError
from django.http import HttpRequest
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from .. import services, sql
from ..exceptions import InvalidSchedule
from ..models import WAITING, Job, Status
from .display import actor

Report = Callable[[HttpRequest, str, int], None]
#: A message for a count, in the singular or plural the count asks for (``ngettext``).
Words = Callable[[int], str]

#: Jobs read per query while an action walks a selection.
BATCH = 1000
#: The salt of the time a purge confirmation carries (``shown_token``).
PURGE_SALT = "django_delayjobs.admin.purge"
#: Jobs a refusal message names, each with its reason; the rest are counted in one line
#: (a selection of 100,000 would otherwise put as many messages into the session).
REFUSALS_NAMED = 10


@dataclass
class Outcome:
    won: int = 0
    lost: int = 0
    #: A Redis call after a change failed: the later ones were left to reconcile.
    redis_down: bool = False


@dataclass
class Refusals:
    """Jobs a service refused, with its reason: the first ``REFUSALS_NAMED`` are kept to
    be named, the others only counted."""

    named: list[str] = field(default_factory=list)
    count: int = 0

    def append(self, text: str) -> None:
        self.count += 1
        if len(self.named) < REFUSALS_NAMED:
            self.named.append(text)

    @property
    def unnamed(self) -> int:
        return self.count - len(self.named)

    def saying(
        self, report: Report, request: HttpRequest, *, more: Words, won: Words, lost: Words
    ) -> Callable[[Outcome], None]:
        """The ``say`` of an action that refuses some jobs by name: the refusals, then
        the other outcomes (a refused job is not also counted as lost). ``more`` words
        the count of refusals beyond the named ones."""

        def say(outcome: Outcome) -> None:
            outcome.lost -= self.count
            for text in self.named:
                report(request, text, messages.WARNING)
            if self.unnamed:
                report(request, more(self.unnamed) % self.unnamed, messages.WARNING)
            if not self.count or outcome.won or outcome.lost:
                _report(report, request, outcome, won(outcome.won), lost(outcome.lost))

        return say


def walk(queryset: QuerySet[Job], batch: int = BATCH) -> Iterator[Job]:
    """Every job of ``queryset`` once, read ``batch`` at a time in primary-key order.

    Not ``queryset.iterator()``: that walks the list's order (run_at) while the actions
    change run_at and status, and SQLite's cursor meets a moved row again (run now moved
    2,000 of 2,100 jobs twice). The primary key never changes, so a walk by it meets each
    row once, and holds one batch in memory however many jobs are selected. It ends at an
    empty batch, not a short one: a poison row without a readable id is left out of its
    batch.
    """
    jobs = queryset.order_by("pk")
    last = None
    while rows := list((jobs if last is None else jobs.filter(pk__gt=last))[:batch]):
        yield from rows
        last = rows[-1].pk


def _each(
    request: HttpRequest,
    report: Report,
    jobs: Iterable[Job],
    eligible: Callable[[Job], bool],
    verb: Callable[[Job], bool],
    say: Callable[[Outcome], None],
) -> Outcome:
    """Apply ``verb`` to each job of ``jobs`` and ``say`` the outcome. Each job commits on
    its own (the admin runs its actions outside ``ATOMIC_REQUESTS``): a database error
    part-way is said with what was done before it, then raised. Within a transaction of
    the caller's, which the error undoes whole, it is only raised."""
    outcome = Outcome()
    with services.skip_redis_after_a_failure() as redis:
        try:
            for job in jobs:
                # The status read here only spares a call that cannot win; the service's
                # conditional UPDATE is what decides.
                if eligible(job) and verb(job):
                    outcome.won += 1
                else:
                    outcome.lost += 1
        except DatabaseError as exc:
            if transaction.get_connection(sql.db()).in_atomic_block:
                raise
            outcome.redis_down = redis.down
            say(outcome)
            text = _("A database error (%s) stopped the action: the job it was changing "
                     "and those after it were left as they were.") % type(exc).__name__  # fmt: skip
            report(request, text, messages.ERROR)
            raise
    outcome.redis_down = redis.down
    say(outcome)
    return outcome


def report_gone(request: HttpRequest, report: Report, selected: int, found: int) -> None:
    """Say how many of the ``selected`` jobs no longer exist (purged since the page that
    listed them was read): the verbs' own counts only see the ``found`` ones."""
    gone = selected - found
    if gone > 0:
        text = ngettext("%d job no longer exists.", "%d jobs no longer exist.", gone) % gone
        report(request, text, messages.WARNING)


def cancel(request: HttpRequest, jobs: Iterable[Job], report: Report) -> Outcome:
    who = actor(request)

    def say(outcome: Outcome) -> None:
        _report(
            report, request, outcome,
            ngettext("%d job cancelled.", "%d jobs cancelled.", outcome.won),
            ngettext(
                "%d job was not cancelled: it had already started or finished.",
                "%d jobs were not cancelled: they had already started or finished.",
                outcome.lost,
            ),
        )  # fmt: skip

    def stop(job: Job) -> bool:
        return services.cancel(job, actor=who)

    return _each(request, report, jobs, lambda j: j.status in WAITING, stop, say)


def run_now(request: HttpRequest, jobs: Iterable[Job], report: Report) -> Outcome:
    who = actor(request)

    def now(job: Job) -> bool:
        try:
            return services.reschedule(job, in_=0, actor=who)
        except InvalidSchedule:  # past its expiry: it may no longer start
            return False

    def say(outcome: Outcome) -> None:
        _report(
            report, request, outcome,
            ngettext("%d job is due now.", "%d jobs are due now.", outcome.won),
            ngettext(
                "%d job was not moved: it had already started, finished or expired.",
                "%d jobs were not moved: they had already started, finished or expired.",
                outcome.lost,
            ),
        )  # fmt: skip

    return _each(request, report, jobs, lambda j: j.status in WAITING, now, say)


def requeue(request: HttpRequest, jobs: Iterable[Job], report: Report) -> Outcome:
    who = actor(request)
    refused = Refusals()

    def again(job: Job) -> bool:
        try:
            return services.requeue(job, actor=who)
        except InvalidSchedule as exc:  # its key is held again, too many attempts, expired
            refused.append(f"Job {job.pk} was not requeued: {exc}.")
            return False

    say = refused.saying(
        report, request,
        more=lambda n: ngettext("%d more job was not requeued for such reasons.",
                                "%d more jobs were not requeued for such reasons.", n),
        won=lambda n: ngettext("%d dead job requeued.", "%d dead jobs requeued.", n),
        lost=lambda n: ngettext("%d job was not requeued: it was not dead.",
                                "%d jobs were not requeued: they were not dead.", n),
    )  # fmt: skip
    return _each(request, report, jobs, lambda j: j.status == Status.DEAD, again, say)


def shown_token() -> str:
    """What a purge confirmation's form carries, signed: the newest job event before it
    read the jobs it shows. Not the time: a job's death is stamped by its worker's clock,
    and one a minute behind would have a job that died after the page was read purged."""
    return signing.dumps(services.last_event(), salt=PURGE_SALT)


def shown_fence(request: HttpRequest) -> int | None:
    """The newest job event when the confirmation that ``request`` posts read its jobs;
    None for a POST that does not come from one (no token, or one that is not ours)."""
    try:
        fence = signing.loads(request.POST.get("shown", ""), salt=PURGE_SALT)
    except signing.BadSignature:
        return None
    return fence if type(fence) is int else None  # an older page's time: ask again


def purge(request: HttpRequest, jobs: Iterable[Job], report: Report, *, shown: int) -> Outcome:
    """Purge the dead ones of ``jobs`` that had died when the confirmation read them (none
    of their events is newer than ``shown``): the selection is read again, and a job that
    died since was never shown."""
    user_id = request.user.pk
    assert user_id is not None  # the admin only lets logged-in staff this far
    refused = Refusals()

    def gone(job: Job) -> bool:
        # The job's own history goes with it, so the admin log keeps who purged it. The
        # log may be on another database than the jobs (the project's): its transaction
        # is the outer one, so it commits only once the purge has (a database that
        # refuses the purge as it commits, a deferred foreign key, rolls the log back
        # too); on one database the two are one transaction.
        try:
            with (
                transaction.atomic(using=router.db_for_write(LogEntry)),
                transaction.atomic(using=router.db_for_write(Job)),
            ):
                if not services.purge(job, unchanged_since=shown):
                    if Job.objects.filter(pk=job.pk, status=Status.DEAD).exists():
                        refused.append(
                            f"Job {job.pk} was not purged: it died after the confirmation "
                            "was shown."
                        )
                    return False
                LogEntry.objects.log_actions(
                    user_id=user_id, queryset=[job], action_flag=DELETION,
                    change_message="Purged (dead job) from the admin.",
                )  # fmt: skip
                return True
        except IntegrityError as exc:  # another table refers to it: kept, with its history
            refused.append(f"Job {job.pk} was not purged: {_referrers(exc)}.")
            return False

    say = refused.saying(
        report, request,
        more=lambda n: ngettext("%d more job was not purged for such reasons.",
                                "%d more jobs were not purged for such reasons.", n),
        won=lambda n: ngettext("%d dead job purged.", "%d dead jobs purged.", n),
        lost=lambda n: ngettext("%d job was not purged: it was not dead.",
                                "%d jobs were not purged: they were not dead.", n),
    )  # fmt: skip
    return _each(request, report, jobs, lambda j: j.status == Status.DEAD, gone, say)


def _referrers(exc: IntegrityError) -> str:
    """What refused a purge: the models whose ``PROTECT``/``RESTRICT`` foreign keys refer
    to the job (Django's refusal), or the database's own words."""
    if isinstance(exc, ProtectedError | RestrictedError):
        found = exc.protected_objects if isinstance(exc, ProtectedError) else exc.restricted_objects
        labels = sorted({obj._meta.label for obj in found})
        return f"{', '.join(labels)} {'refers' if len(labels) == 1 else 'refer'} to it"
    return f"the database refused: {str(exc).strip() or type(exc).__name__}"


def _report(report: Report, request: HttpRequest, outcome: Outcome, won: str, lost: str) -> None:
    if outcome.won or not outcome.lost:
        report(request, won % outcome.won, messages.SUCCESS)
    if outcome.lost:
        report(request, lost % outcome.lost, messages.WARNING)
    if outcome.redis_down:
        text = _("Redis did not answer: the changes are in the database, and reconcile "
                 "hands them to Redis when it is back.")  # fmt: skip
        report(request, text, messages.WARNING)
