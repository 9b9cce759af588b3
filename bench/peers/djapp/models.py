"""The delayjobs benchmark action (a models module, so the worker imports it)."""

from django_delayjobs import delayable
from peers import common


@delayable
def record(job_id: str, due: float) -> None:
    common.record(job_id, due)
