"""The ``django.tasks`` names the backend uses: Django 6's own, or the backport's.

One place for the import dance: Django 6.0+ has ``django.tasks``; Django 5.2 gets the
same API from the ``django-tasks`` backport (the ``tasks`` extra), where ``InvalidTask``
is called ``InvalidTaskError``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # type-check against Django 6's own module (django-stubs has it)
    from django.tasks import TaskResultStatus, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
else:
    try:  # Django 6.0+
        from django.tasks import TaskResultStatus, task_backends
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import Task, TaskContext, TaskError, TaskResult
        from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
        from django.tasks.signals import task_enqueued, task_finished, task_started
        from django.utils.json import normalize_json
    except ImportError:  # Django 5.2 with the django-tasks backport
        from django_tasks import TaskResultStatus, task_backends
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskContext, TaskError, TaskResult
        from django_tasks.exceptions import InvalidTaskError as InvalidTask
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started
        from django_tasks.utils import normalize_json

        if "SUCCESSFUL" not in TaskResultStatus.__members__:  # 0.9 to 0.11 say SUCCEEDED
            needs = "DelayJobsBackend needs django-tasks 0.12 or later on Django 5.2"
            raise ImportError(needs) from None

__all__ = [
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
