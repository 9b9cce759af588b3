"""``django.tasks`` functions, run by the DelayJobsBackend (imported by tasks.py)."""

import collections

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task

from django_delayjobs import GiveUp

from .models import Record

#: What a task might put in its message: the body of a remote service's error page, a
#: subprocess's stderr, a traceback logged by another program.
REMOTE_TRACEBACK = (
    "the pricing service answered 500:\n"
    "Traceback (most recent call last):\n"
    '  File "/srv/pricing/views.py", line 12, in quote\n'
    "KeyError: 'sku'"
)


@task
def add(a: int, b: int) -> int:
    Record.objects.create(label=f"add:{a}+{b}")
    return a + b


@task(queue_name="other")
def explode(message: str) -> None:
    raise ValueError(message)


@task(takes_context=True)
def introspect(context, label: str) -> dict:
    Record.objects.create(label=label)
    return {"attempt": context.attempt, "status": str(context.task_result.status)}


@task(takes_context=True)
def flaky(context, label: str) -> int:
    """Fails its first attempt (after a write that must roll back), succeeds the next."""
    Record.objects.create(label=f"{label}:{context.attempt}")
    if context.attempt < 2:
        raise ValueError(f"attempt {context.attempt} fails\nsecond line of the message")
    return context.attempt


@task
async def async_add(a: int, b: int) -> int:
    await Record.objects.acreate(label=f"async:{a}+{b}")
    return a + b


@task
async def async_explode(label: str) -> None:
    await Record.objects.acreate(label=label)  # rolled back with the failure
    raise RuntimeError(f"async failure: {label}")


@task
def returns_object(label: str) -> object:
    Record.objects.create(label=label)  # rolled back: the return value fails the task
    return object()


@task
def returns_too_much(label: str) -> str:
    Record.objects.create(label=label)  # rolled back: the return value fails the task
    return "x" * (1 << 20)  # past MAX_JSON_BYTES (1 MiB) once quoted


@task
def returns_tuple() -> tuple[int, str]:
    return (1, "two")


@task
def fail_quoting_a_traceback() -> None:
    raise ValueError(REMOTE_TRACEBACK)


@task
def give_up(reason: str) -> None:
    raise GiveUp(reason)


@task
def returns_int_keys(label: str) -> dict[int, str]:
    Record.objects.create(label=label)
    return {1: label, 2: "two"}  # JSON keys are strings: {"1": label, "2": "two"}


@task
def returns_colliding_keys(label: str) -> dict[object, str]:
    Record.objects.create(label=label)  # rolled back: the return value fails the task
    return {1: "int", "1": "str"}


@task
def returns_itself(label: str) -> dict[str, object]:
    Record.objects.create(label=label)  # rolled back: the return value fails the task
    loop: dict[str, object] = {}
    loop["me"] = [loop]
    return loop


@task
def echo(*values: object) -> list[object]:
    return list(values)


@task
def returns_sequence_in_itself(kind: str) -> object:
    """Returns a ``UserList`` or ``deque`` that contains itself."""
    loop = {"UserList": collections.UserList, "deque": collections.deque}[kind]()
    loop.append(loop)
    return loop


@task
async def fork_and_wait(child: str, seconds: float) -> int:
    """Forks in its event loop's thread; see ``tasks.fork_and_wait`` for ``child``."""
    from .tasks import _fork_and_wait

    return _fork_and_wait(child, seconds)


@task
async def async_unwind(kind: str) -> None:
    """Raises, from its coroutine, what unwinds a program: KeyboardInterrupt, SystemExit."""
    await Record.objects.acreate(label=kind)  # rolled back with the failure
    raise {"KeyboardInterrupt": KeyboardInterrupt, "SystemExit": SystemExit}[kind](kind)
