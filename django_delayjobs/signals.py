"""Signals django-delayjobs sends, each after the change it reports has committed.

Every signal is sent with ``sender=Job`` and ``job=<the Job>``; ``job_failed`` and
``job_dead`` also carry ``error`` (the formatted exception).
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


def send(signal: Signal, job: Any, **kwargs: Any) -> None:
    """Send ``signal`` for ``job``; a failing receiver is logged, never raised to the
    worker or to a transaction that already committed."""
    for receiver, result in signal.send_robust(sender=type(job), job=job, **kwargs):
        if isinstance(result, Exception):
            logger.error("receiver %r of a django-delayjobs signal failed", receiver,
                         exc_info=result)  # fmt: skip
