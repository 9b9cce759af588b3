"""Module-level actions for the tests."""

import contextlib
import itertools
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from django.db import DatabaseError, connection

from django_delayjobs import delayable
from django_delayjobs.models import Job

from .models import Record


@delayable
def record(label: str, **extra: object) -> str:
    Record.objects.create(label=label)
    return label


@delayable
def echo(*args: object, **kwargs: object) -> None:
    Record.objects.create(label=repr((args, kwargs)))


@delayable
def fail(label: str = "boom") -> None:
    Record.objects.create(label=f"attempt:{label}")
    raise RuntimeError(f"failing on purpose: {label}")


@delayable
def slow(label: str, seconds: float) -> None:
    time.sleep(seconds)
    Record.objects.create(label=label)


@delayable
def mark_then_sleep(path: str, seconds: float) -> None:
    """Create the file ``path`` (seen by a test in another process at once, unlike a row
    of this uncommitted transaction), then sleep: the action is under way."""
    with open(path, "x"):
        pass
    time.sleep(seconds)


@delayable
def slow_in_a_thread(label: str, seconds: float) -> None:
    """Wait for a ThreadPoolExecutor's thread: at exit Python joins such threads (it
    registers that with ``threading``), so one keeps its process alive until it ends."""
    with ThreadPoolExecutor(1) as pool:
        pool.submit(time.sleep, seconds).result()
    Record.objects.create(label=label)


def plain(label: str) -> None:
    """Not registered: scheduling it must fail."""


@delayable
def hold_the_interpreter() -> None:
    """C code that never lets another thread (nor a signal handler) run: sum() over a C
    iterator never releases the GIL, for hours."""
    sum(itertools.repeat(1, 10**15))


@delayable
def wait_for_file(path: str, seconds: float) -> str:
    """Return once the file ``path`` exists (a test's go-ahead), or after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return "waited"


@delayable(atomic=False)
def wait_for_file_outside(path: str, seconds: float) -> str:
    """``wait_for_file`` outside any transaction: on SQLite, an atomic action's open
    transaction keeps every other process from writing (claiming a job) while it waits."""
    return wait_for_file(path, seconds)


@delayable
def write_then_sleep(label: str, seconds: float) -> None:
    """Write first, then sleep: a kill during the sleep must roll the write back."""
    Record.objects.create(label=label)
    time.sleep(seconds)


#: What ``keep`` was called with (in burst mode the worker runs in the test's process).
kept: list[tuple[tuple[object, ...], dict[str, object]]] = []


@delayable
def keep(*args: object, **kwargs: object) -> None:
    kept.append((args, kwargs))


#: The database connections the actions of ``note_connection`` ran on (kept alive, so
#: that distinct connections have distinct ids).
seen_connections: list[object] = []


@delayable
def note_connection() -> None:
    seen_connections.append(connection.connection)


@delayable
def note_autocheckpoint() -> int:
    """Record the ``wal_autocheckpoint`` of the connection the action runs on (SQLite)."""
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA wal_autocheckpoint")
        pages = cursor.fetchone()[0]
    Record.objects.create(label=f"autocheckpoint:{pages}")
    return pages


@delayable
def cancel_job(job_id: str) -> None:
    """Cancel another job from inside an action and record whether the cancel won."""
    won = Job.objects.get(pk=job_id).cancel()
    Record.objects.create(label=f"cancelled:{won}")


@delayable
def refused_at_commit(label: str) -> None:
    """Writes a row whose foreign key points nowhere. Django's foreign keys are checked at
    COMMIT (deferred), so the action returns and its outcome is written in its transaction,
    and then the database refuses that transaction."""
    from django.contrib.auth.models import Permission

    Record.objects.create(label=label)
    Permission.objects.create(name=label, codename=label[:100], content_type_id=2**31 - 1)


from . import task_functions  # noqa: E402,F401  (the worker imports @task functions via tasks.py)

# -- actions for the robustness tests ------------------------------------------------------


class CustomBaseException(BaseException):
    """Not an Exception: what a library might raise to unwind everything."""


@delayable
def raise_base(kind: str) -> None:
    """Write, then raise a BaseException: the write must roll back, the worker live on."""
    Record.objects.create(label=f"before:{kind}")
    errors: dict[str, BaseException] = {
        "SystemExit": SystemExit(3),
        "KeyboardInterrupt": KeyboardInterrupt(),
        "GeneratorExit": GeneratorExit(),
        "custom": CustomBaseException("unwinding"),
    }
    raise errors[kind]


@delayable
def retry_later(seconds: float, label: str) -> str:
    """Fails its first attempt with Retry(after=seconds), then records."""
    from django_delayjobs import Retry
    from django_delayjobs.execution import current_job

    job = current_job.get()
    assert job is not None
    if job.attempts == 1:
        raise Retry(f"not yet, try in {seconds} s", after=seconds)
    Record.objects.create(label=label)
    return label


@delayable
def retry_after_text(after: str) -> None:
    """Asks to be retried after ``float(after)`` seconds (JSON holds no NaN or inf)."""
    from django_delayjobs import Retry

    raise Retry("receiver busy", after=float(after))


@delayable
def raise_text(escaped: str) -> None:
    """Raises with ``escaped``, its escapes decoded, as its message: a NUL or a lone
    surrogate, which no argument may hold."""
    raise RuntimeError(escaped.encode().decode("unicode_escape"))


@delayable
def give_up(reason: str) -> None:
    from django_delayjobs import GiveUp

    Record.objects.create(label="gave up")
    raise GiveUp(reason)


@delayable
def noted(*lines: str) -> str:
    from django_delayjobs.execution import note

    for line in lines:
        note(line)
    return "noted"


@delayable
async def async_record(label: str) -> dict[str, str]:
    """An async action: its ORM call runs in the worker's transaction."""
    from asgiref.sync import sync_to_async

    await sync_to_async(Record.objects.create)(label=label)
    return {"label": label}


@delayable
def return_unstorable(label: str) -> object:
    Record.objects.create(label=label)
    return object()


@delayable
def return_large(label: str, size: int) -> str:
    Record.objects.create(label=label)
    return "x" * size


@delayable
def end_process(code: int) -> None:
    """Ends the worker process from inside an action (a crash, an OOM kill)."""
    import os

    os._exit(code)


@delayable
def stop_redis_then_fail(url: str) -> None:
    """Shuts the test's Redis down, then fails: the outcome must still be signalled."""
    import contextlib

    import redis

    with contextlib.suppress(redis.ConnectionError):  # the server hangs up as it goes
        redis.Redis.from_url(url).shutdown(nosave=True)
    raise RuntimeError("failing after Redis went away")


@delayable
def stop_redis_saving_then_fail(url: str) -> None:
    """Shuts the test's Redis down, saving its data (this job in flight) for its restart,
    then fails."""
    import contextlib

    import redis

    with contextlib.suppress(redis.ConnectionError):  # the server hangs up as it goes
        redis.Redis.from_url(url).shutdown(save=True)
    raise RuntimeError("failing after Redis went away")


@delayable(atomic=False)
def stop_redis_then_hang(url: str, seconds: float) -> None:
    """Shuts the test's Redis down, saving its data for its restart, then sleeps."""
    import contextlib

    import redis

    with contextlib.suppress(redis.ConnectionError):  # the server hangs up as it goes
        redis.Redis.from_url(url).shutdown(save=True)
    time.sleep(seconds)


@delayable(atomic=False)
def retry_then_call_out(seconds: float) -> None:
    """Attempt 1 asks to be retried at once; attempt 2 is a long call outside any
    transaction (an HTTP request, say), recorded once per run."""
    from django_delayjobs import Retry
    from django_delayjobs.execution import current_job

    job = current_job.get()
    assert job is not None
    if job.attempts == 1:
        raise Retry("the receiver is busy", after=0)
    Record.objects.create(label=f"called out: attempt {job.attempts} delivery {job.deliveries}")
    time.sleep(seconds)


def _install_test_hooks() -> None:
    """Faults and observers that process tests switch on through the environment."""
    import os

    from django_delayjobs import signals

    if os.environ.get("DELAYJOBS_TEST_RECORD_SIGNALS"):

        def receiver(signal_name: str):  # type: ignore[no-untyped-def]
            def record_signal(sender: object, job: Job, **kwargs: object) -> None:
                Record.objects.create(label=f"signal:{signal_name}:{job.pk}")

            return record_signal

        for name in ("job_succeeded", "job_failed", "job_dead"):
            getattr(signals, name).connect(receiver(name), weak=False)
    if os.environ.get("DELAYJOBS_TEST_FAILED_QUERY"):  # leaves errors_occurred on its connection

        def failed_query(sender: object, job: Job, **kwargs: object) -> None:
            with contextlib.suppress(DatabaseError), connection.cursor() as cursor:
                cursor.execute("SELECT * FROM delayjobs_no_such_table")

        signals.job_succeeded.connect(failed_query, weak=False)
    if os.environ.get("DELAYJOBS_TEST_QUERY_ON_IMPORT"):  # a tasks module that reads at import
        Record.objects.exists()
    if os.environ.get("DELAYJOBS_TEST_RESULT_ON_IMPORT"):  # one that reads a task's result
        _read_result(os.environ["DELAYJOBS_TEST_RESULT_ON_IMPORT"])
    broken = os.environ.get("DELAYJOBS_TEST_BREAK_THREAD")
    if broken == "promoter":
        from django_delayjobs.promoter import Promoter

        def step(self: Promoter) -> float:
            raise RuntimeError("a bug in the promoter")

        Promoter.step = step  # type: ignore[method-assign]
    if os.environ.get("DELAYJOBS_TEST_KILL_AT"):
        _kill_at(os.environ["DELAYJOBS_TEST_KILL_AT"])


def _read_result(result_id: str) -> None:
    """Read a task's result by id at import, and print how that went."""
    from django_delayjobs.backends import TaskResultDoesNotExist

    try:
        from django.tasks import default_task_backend
    except ImportError:  # Django 5.2: the backport
        from django_tasks import default_task_backend
    try:
        said = str(default_task_backend.get_result(result_id).status)
    except TaskResultDoesNotExist as exc:
        said = type(exc).__name__
    print(f"at-import:{said}", flush=True)


def _kill_at(step: str) -> None:
    """SIGKILL this worker process at ``step`` of its first delivery (test_audit_rce2.py):
    ``redis-claim`` (ids in flight, no row claimed), ``db-claim`` (the claim committed),
    ``action`` (its write not committed), ``outcome`` (written, not committed), ``ack``
    (committed, Redis not told)."""
    import signal

    from django.db.models.signals import post_save

    from django_delayjobs import worker
    from django_delayjobs.engine import Engine
    from django_delayjobs.execution import Execution

    def die(*args: object, **kwargs: object) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def after(owner: object, name: str, when: object = bool) -> None:
        real = getattr(owner, name)

        def patched(*args: object, **kwargs: object) -> object:
            value = real(*args, **kwargs)
            if when(value):  # type: ignore[operator]
                die()
            return value

        setattr(owner, name, patched)

    if step == "redis-claim":
        after(Engine, "claim")
    elif step == "db-claim":
        after(Execution, "claim", lambda value: isinstance(value, Job))
    elif step == "action":
        post_save.connect(die, sender=Record, weak=False)
    elif step == "outcome":
        after(Execution, "succeeded", lambda value: True)
    elif step == "ack":
        worker.settle = die  # type: ignore[assignment]
    else:
        raise ValueError(f"DELAYJOBS_TEST_KILL_AT: no step {step!r}")


_install_test_hooks()


@delayable
def chaos_step(n: int, plan: str, seconds: float) -> int:
    """One job of the chaos test: ``ok`` writes its effect; ``flaky`` raises a random
    BaseException on its first attempt, then writes; ``doomed`` raises on every attempt."""
    import random

    from django_delayjobs.execution import current_job

    job = current_job.get()
    assert job is not None
    time.sleep(seconds)
    if plan == "doomed" or (plan == "flaky" and job.attempts == 1):
        raise random.choice([SystemExit(1), KeyboardInterrupt(), RuntimeError("chaos"),
                             CustomBaseException("chaos")])  # fmt: skip
    Record.objects.create(label=f"effect:{n}")
    return n


@delayable
def lock_own_row_then_sleep(seconds: float) -> None:
    """Locks its own job's row (PostgreSQL; SQLite's transaction holds the write lock
    anyway), then sleeps: nobody else can write that row until it ends."""
    from django_delayjobs.execution import current_job
    from django_delayjobs.models import Job

    job = current_job.get()
    assert job is not None
    Job.objects.select_for_update().get(pk=job.pk)
    time.sleep(seconds)


@delayable(atomic=False)
def slow_outside(label: str, seconds: float) -> None:
    """Not atomic, and slow: sleeps, then writes a row outside any transaction."""
    time.sleep(seconds)
    Record.objects.create(label=label)


@delayable(atomic=False)
def read_only_session_then_fail() -> None:
    """Leave this thread's database session refusing writes, then fail: the worker cannot
    record the failure, and a connection it kept would refuse its next claims too."""
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
    raise RuntimeError("the failure that cannot be written")


#: Set by a test once the database has failed over (``call_out_during_failover``).
failed_over = threading.Event()


@delayable(atomic=False)
def call_out_during_failover() -> None:
    """Not atomic: records its call out, then waits (in this process) for the test to fail
    the database over under it."""
    Record.objects.create(label="called out")
    failed_over.wait(10)


@delayable(atomic=False)
def outside_call(label: str, fail: bool) -> bool:
    """Not atomic: runs outside any transaction; its writes stay even when it fails."""
    Record.objects.create(label=label)
    if fail:
        raise RuntimeError("the outside world said no")
    return connection.in_atomic_block


@delayable
def record_then_hook_raises(label: str, kind: str) -> str:
    """Writes, then leaves an on-commit callback that raises (an e-mail sent once the
    transaction commits, with the mail server down): the action itself succeeded."""
    from django.db import transaction

    Record.objects.create(label=label)

    def send_mail() -> None:
        raise SystemExit(1) if kind == "SystemExit" else RuntimeError("the mail server is down")

    transaction.on_commit(send_mail)
    return label


class Unprintable(Exception):
    """An exception whose text cannot be had: its ``__str__`` unwinds everything."""

    def __str__(self) -> str:
        raise KeyboardInterrupt


@delayable
def raise_unprintable() -> None:
    Record.objects.create(label="before:unprintable")
    raise Unprintable


@delayable
def change_session(statement: str) -> str:
    """Runs ``statement`` (a ``SET`` that outlives the action's transaction) and succeeds."""
    with connection.cursor() as cursor:
        cursor.execute(statement)
    return statement


@delayable
def record_then_set_rollback(label: str) -> str:
    """Writes, then marks its transaction for rollback and returns as if all went well."""
    from django.db import transaction

    Record.objects.create(label=label)
    transaction.set_rollback(True)
    return label


@delayable(atomic=False)
def autocommit_off_then_record(label: str) -> str:
    """Turns autocommit off (transaction management as before Django 1.6), writes, and
    returns without committing or turning it back on."""
    from django.db import transaction

    transaction.set_autocommit(False)
    Record.objects.create(label=label)
    return label


def _leave_atomic_open(label: str, raise_after: bool) -> str:
    from django.db import transaction

    transaction.atomic().__enter__()
    Record.objects.create(label=label)
    if raise_after:
        raise RuntimeError("failing with an atomic block left open")
    return label


@delayable
def leave_atomic_open(label: str, raise_after: bool = False) -> str:
    """Enters an atomic block it never exits (a context manager entered by hand), writes,
    and returns (or raises)."""
    return _leave_atomic_open(label, raise_after)


@delayable(atomic=False)
def leave_atomic_open_outside(label: str, raise_after: bool = False) -> str:
    """``leave_atomic_open`` for an action that runs outside the job's transaction."""
    return _leave_atomic_open(label, raise_after)


@delayable
def close_connection(label: str, query_after: bool) -> str:
    """Writes, closes the database connection (a library that cleans up after itself),
    and maybe queries again."""
    Record.objects.create(label=label)
    connection.close()
    if query_after:
        Record.objects.filter(label=label).exists()
    return label


@delayable
def delete_own_job(label: str) -> str:
    """Writes, then deletes the row of the job running it."""
    from django_delayjobs.execution import current_job

    Record.objects.create(label=label)
    job = current_job.get()
    assert job is not None
    Job.objects.filter(pk=job.pk).delete()
    return label


@delayable(atomic=False)
def delete_own_job_outside(label: str) -> str:
    """``delete_own_job`` outside any transaction."""
    return delete_own_job(label)


@delayable(atomic=False)
def close_connection_in_own_block(label: str) -> str:
    """Outside the job's transaction, writes in an atomic block of its own, closes the
    connection inside it and queries again."""
    from django.db import transaction

    with transaction.atomic():
        Record.objects.create(label=label)
        connection.close()
        Record.objects.filter(label=label).exists()
    return label


@delayable
def fork_and_wait(child: str, seconds: float) -> int:
    """Forks; the child ends as a script's child often does (``child``: ``"exit"`` raises
    ``SystemExit(3)``, ``"exit-huge"`` with a code past 64 bits, ``"return"`` returns,
    ``"raise"`` raises ``RuntimeError``), not by ``os._exit``. The parent waits for it (at
    most ``seconds``, then kills it) and returns its exit code (-9 if it had to be killed)."""
    return _fork_and_wait(child, seconds)


@delayable
async def fork_and_wait_async(child: str, seconds: float) -> int:
    """``fork_and_wait`` in a coroutine (which runs in an event loop's thread)."""
    return _fork_and_wait(child, seconds)


def _fork_and_wait(child: str, seconds: float) -> int:
    import os
    import signal

    pid = os.fork()
    if pid == 0:
        if child == "exit":
            raise SystemExit(3)
        if child == "exit-huge":
            raise SystemExit(2**70 + 4)  # too large for os._exit(): 4 is what the system keeps
        if child == "raise":
            raise RuntimeError("the child failed")
        return -1
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@delayable
def leave_a_thread(how: str, seconds: float) -> str:
    """Leave a thread running ``seconds`` after the action returns: a task handed to a
    ThreadPoolExecutor ("pool"), or a thread of its own that is not a daemon ("thread"),
    as a fire-and-forget send does. Python waits for both at exit."""
    if how == "pool":
        ThreadPoolExecutor(1).submit(time.sleep, seconds)
    else:
        threading.Thread(target=time.sleep, args=[seconds], daemon=False).start()
    return how


@delayable(atomic=False)
def break_housekeeping_then_call_out(seconds: float) -> None:
    """On its first delivery, make the worker's metrics flush raise (a bug that kills the
    housekeeping thread, which also extends the leases); then a long call outside any
    transaction, recorded once per delivery."""
    from django_delayjobs import metrics
    from django_delayjobs.execution import current_job

    job = current_job.get()
    assert job is not None
    if job.deliveries == 1:

        def flush(*args: object, **kwargs: object) -> None:
            raise RecursionError("a bug in the metrics flush")

        metrics.flush = flush  # type: ignore[assignment]
    time.sleep(seconds)
    Record.objects.create(label=f"called out: delivery {job.deliveries}")
