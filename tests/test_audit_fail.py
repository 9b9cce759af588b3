"""Audit of failure handling: faults that leave a job lost, stuck or misreported."""

from __future__ import annotations

import time

import pytest
from django.core.management import call_command

from django_delayjobs import delayable, schedule
from django_delayjobs.models import Job, Status

pytestmark = pytest.mark.django_db(transaction=True)


def burst() -> None:
    call_command("run_delayworker", "--burst", "-v", "0")


@delayable
def raise_text(text: str) -> None:
    raise RuntimeError(text.encode().decode("unicode_escape"))


@pytest.mark.parametrize("text", ["r\\udce9sum", "a\\x00b"])
def test_an_exception_text_with_a_lone_surrogate_is_the_actions_failure(caplog, text):
    job = schedule(raise_text, in_=0, args=[text], max_attempts=1)
    burst()
    job.refresh_from_db()
    print(job.status, job.attempts, job.deliveries, repr(job.last_error[:300]))
    print([ (r.levelname, r.getMessage()[:200]) for r in caplog.records])
    assert job.status == Status.DEAD
    assert [e.kind for e in job.events.order_by("at", "id")] == ["scheduled", "started", "failed", "dead"]


def test_a_row_whose_queue_is_not_a_valid_name_does_not_stop_the_worker(redis_client):
    """A poison row (raw SQL, an older version): its queue cannot name Redis keys. The
    reconcile sweep must skip it (as it skips a row whose id is not one), not die and
    take the worker process down with it at every start."""
    import threading

    from django.db import connection

    from django_delayjobs.connection import get_engine
    from django_delayjobs.worker import Options, WorkerDied, WorkerProcess
    from tests.helpers import wait_for
    from tests.testapp import tasks
    from tests.testapp.models import Record

    bad = schedule(tasks.record, in_=0, args=["poison"])
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {Job._meta.db_table} SET queue = %s WHERE id = %s",
                       ["old queue", Job._meta.pk.get_db_prep_value(bad.pk, connection)])
    process = WorkerProcess(get_engine(), Options(queues=["default"], tick=0.1))
    died: list[BaseException] = []

    def run() -> None:
        try:
            process.run()
        except WorkerDied as exc:
            died.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        time.sleep(1.5)
        schedule(tasks.record, in_=0, args=["healthy"])
        time.sleep(1.5)
        assert not died, died
        assert thread.is_alive()
        wait_for(lambda: Record.objects.filter(label="healthy").exists(), timeout=5)
    finally:
        process.stop()
        thread.join(10)
