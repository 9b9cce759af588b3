"""Signals django-delayjobs sends, each after the change it reports has committed.

Every signal is sent with ``sender=Job`` and ``job=<the Job>``; ``job_failed`` and
``job_dead`` also carry ``error`` (the formatted exception).
"""

from django.dispatch import Signal

job_scheduled = Signal()
job_cancelled = Signal()
job_started = Signal()
job_succeeded = Signal()
job_failed = Signal()
job_dead = Signal()
