from collections.abc import Mapping

from django.apps import AppConfig

BACKEND = "django_delayjobs.backends.DelayJobsBackend"


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
        if uses_task_backend():
            try:  # Django 6's django.tasks, or the backport on 5.2
                from .backends import connect_signals
            except ImportError:  # neither: TASKS is read by nothing, and the backend never runs
                return
            connect_signals()  # task_finished for a task cancelled in a web process


def uses_task_backend() -> bool:
    """Whether ``settings.TASKS`` names ``DelayJobsBackend`` (read, nothing imported)."""
    from django.conf import settings

    tasks = getattr(settings, "TASKS", None)
    if not isinstance(tasks, Mapping):
        return False
    return any(isinstance(params, Mapping) and params.get("BACKEND") == BACKEND
               for params in tasks.values())  # fmt: skip
