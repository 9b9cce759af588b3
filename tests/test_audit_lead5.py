"""The lead's audit, 2026-11-30 (evening): start-up's reading of Redis's version, and a
stop signal that lands inside the main thread's wait."""

import signal
import threading

import pytest

from django_delayjobs.connection import get_engine
from django_delayjobs.exceptions import ConfigurationError
from django_delayjobs.preflight import redis_version
from django_delayjobs.worker import Options, WorkerProcess


@pytest.mark.parametrize(
    ("given", "read"),
    [("6.2.14", (6, 2)), ("7.2.4-rc1", (7, 2)), ("255.0", (255, 0)), ("10.10.10", (10, 10))],
)
def test_the_version_a_redis_compatible_server_reports_is_read(given, read):
    assert redis_version({"redis_version": given}) == read


@pytest.mark.parametrize("given", ["unstable", "", "7", "v7.2", None])
def test_a_version_that_cannot_be_read_stops_start_up_with_a_clear_error(given):
    info = {} if given is None else {"redis_version": given}
    with pytest.raises(ConfigurationError, match="cannot read the version of the Redis server"):
        redis_version(info, " (master 10.0.0.1:6379)")


@pytest.mark.django_db(transaction=True)
def test_a_stop_signal_that_lands_inside_the_main_threads_wait_does_not_deadlock(redis_url):
    """The main thread pauses in ``stopping.wait(0.2)``, five times a second: inside it, it
    holds the event's lock (a plain, non-reentrant one) between entering and waiting, and
    again once the wait ends. SIGTERM's handler runs in that same thread, and it called
    ``stopping.set()``, which waited on that lock for good: the worker stopped only when
    its watchdog fired, the shutdown grace later (the example demo's interrupted run took
    31 s on CI). Here a thread holds the lock and runs the handler, as a signal landing
    there does."""
    process = WorkerProcess(get_engine(), Options(queues=["default"]))

    def signal_inside_the_wait() -> None:
        with process.stopping._cond:  # type: ignore[attr-defined]  # what wait() holds
            process.on_signal(signal.SIGTERM)

    handler = threading.Thread(target=signal_inside_the_wait, daemon=True)
    handler.start()
    handler.join(5)
    assert not handler.is_alive(), "the signal handler waits on the lock its thread holds"
    assert process.signalled
