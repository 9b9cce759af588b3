"""The Django admin of django-delayjobs: the job list and detail, the queue-state page."""

from django.contrib import admin

from ..models import Job
from .jobs import JobAdmin, JobEventInline

admin.site.register(Job, JobAdmin)

__all__ = ["JobAdmin", "JobEventInline"]
