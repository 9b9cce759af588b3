"""``django.tasks`` functions, run by the DelayJobsBackend (imported by tasks.py)."""

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task

from .models import Record


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
