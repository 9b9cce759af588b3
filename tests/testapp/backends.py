"""A project's own subclass of the django.tasks backend."""

from django_delayjobs.backends import DelayJobsBackend


class SubclassBackend(DelayJobsBackend):
    pass
