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
