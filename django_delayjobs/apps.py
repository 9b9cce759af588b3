from collections.abc import Mapping

from django.apps import AppConfig


class DelayJobsConfig(AppConfig):
    name = "django_delayjobs"
    verbose_name = "Delayed jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.signals import setting_changed

        from . import checks  # noqa: F401  (registers the system checks)
        from .callbacks.action import register
        from .conf import reload_on_change

        register()  # the built-in action of HTTP callbacks
        setting_changed.connect(reload_on_change, dispatch_uid="django_delayjobs.conf")
        if not uses_task_backend():
            return
        try:  # Django 6's django.tasks, or the backport on 5.2
            from .backends import connect_signals
        except ImportError:  # neither: the backend never runs
            return
        connect_signals()  # task_finished for a task cancelled in a web process


def uses_task_backend() -> bool:
    """Whether ``settings.TASKS`` may name ``DelayJobsBackend`` or a subclass of it: a
    backend that is not one of ``django.tasks``' or its backport's (read, nothing imported;
    the receivers cost each job a few microseconds)."""
    from django.conf import settings

    tasks = getattr(settings, "TASKS", None)
    if not isinstance(tasks, Mapping):
        return False
    paths = [params.get("BACKEND") for params in tasks.values() if isinstance(params, Mapping)]
    return any(isinstance(path, str) and not path.startswith(("django.tasks.", "django_tasks."))
               for path in paths)  # fmt: skip
