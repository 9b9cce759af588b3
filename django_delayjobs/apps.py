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
        try:  # Django 6's django.tasks, or the backport on 5.2
            from .backends import connect_signals
        except ImportError:  # neither: the backend never runs
            return
        # task_finished for a task cancelled in a process that made no backend (a web
        # process), whichever TASKS entry (this backend, a subclass, an alias removed
        # since) enqueued it; the receivers pass over the jobs of other actions.
        connect_signals()
