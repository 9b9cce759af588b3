"""Signals django-delayjobs sends, each after the change it reports has committed.

Every signal is sent with ``sender=Job`` and ``job=<the Job>``; ``job_failed``,
``job_dead`` and ``job_skipped`` also carry ``error`` (the formatted exception, or for a
job that ended without one, why it ended: the job's ``last_error``).
"""

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger("django_delayjobs")

job_scheduled = Signal()
job_cancelled = Signal()
job_started = Signal()
job_succeeded = Signal()
job_failed = Signal()
job_dead = Signal()
job_skipped = Signal()


def send(signal: Signal, job: Any, **kwargs: Any) -> bool:
    """Send ``signal`` for ``job``; a failing receiver is logged, never raised to the
    worker or to a transaction that already committed. True if it had receivers.

    A receiver that raises a ``BaseException`` (``SystemExit``, a library's exception
    that unwinds everything) is logged too, as the worker treats an action that does;
    ``send_robust`` catches only ``Exception``, so the receivers after it miss this one.
    """
    # Job for a proxy's instance too (a caller's job read through one): not type(job).
    sender = getattr(getattr(job, "_meta", None), "concrete_model", type(job))
    return send_logged(signal, sender, job=job, **kwargs)


def send_logged(signal: Signal, sender: Any, **kwargs: Any) -> bool:
    """Send ``signal`` as ``send`` does, for any sender: the backend's ``django.tasks``
    signals, which follow a commit too."""
    try:
        results = signal.send_robust(sender=sender, **kwargs)
    except BaseException as exc:
        logger.error("a receiver of a django-delayjobs signal raised %r; the receivers "
                     "after it were not called", exc, exc_info=exc)  # fmt: skip
        return True
    for receiver, result in results:
        if isinstance(result, Exception):
            logger.error("receiver %r of a django-delayjobs signal failed", receiver,
                         exc_info=result)  # fmt: skip
    return bool(results)
