"""Who may use the API: the configured classes for every request, and on top of them the
model permissions the admin asks for: ``view_job`` (or ``change_job``) to read,
``change_job`` to write."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeGuard

from rest_framework.permissions import BasePermission, OperationHolderMixin
from rest_framework.request import Request
from rest_framework.settings import perform_import
from rest_framework.views import APIView

from ..conf import delayjobs_settings
from ..exceptions import ConfigurationError

#: What the write actions need on top of ``API_PERMISSION_CLASSES``.
CHANGE_PERMISSION = "django_delayjobs.change_job"
#: What reads need on top of ``API_PERMISSION_CLASSES`` (or ``CHANGE_PERMISSION``).
VIEW_PERMISSION = "django_delayjobs.view_job"


def configured_permissions() -> list[Callable[[], Any]]:
    """Return the classes named by ``DELAYJOBS['API_PERMISSION_CLASSES']``."""
    return load_permissions(delayjobs_settings.API_PERMISSION_CLASSES)


def load_permissions(entries: object) -> list[Callable[[], Any]]:
    """Return the permission classes of a list of dotted paths (or classes); else raise
    ``ConfigurationError`` saying what is wrong, as a predicate of the setting (its
    name is put in front by ``conf``)."""
    setting = "DELAYJOBS['API_PERMISSION_CLASSES']"
    if isinstance(entries, str) or not isinstance(entries, list | tuple):
        raise ConfigurationError(
            f"must be a list of dotted paths to DRF permission classes, not {entries!r}"
        )
    classes: list[Callable[[], Any]] = []
    for entry in entries:
        try:
            # DRF's own loader, as for its DEFAULT_PERMISSION_CLASSES: a class (or A & B)
            # passes through, a dotted path is imported. The paths come from the settings
            # file only, never from Redis or the database (DESIGN rule 6).
            found = perform_import(entry, setting)
        except ImportError as exc:
            cause = exc.__context__ or exc  # DRF's message names the setting again
            raise ConfigurationError(
                f"names {entry!r}, which cannot be imported ({type(cause).__name__}: {cause})"
            ) from exc
        if not is_permission_class(found):
            raise ConfigurationError(f"names {entry!r}, which is not a permission class")
        classes.append(found)
    return classes


def is_permission_class(found: object) -> TypeGuard[Callable[[], Any]]:
    """A ``BasePermission`` subclass, a combination (``A & B``, ``~A``), or a class with
    DRF's two methods: any other callable (``os.system``, a model) passed, and every
    request then answered 500."""
    if isinstance(found, OperationHolderMixin):  # BasePermission's metaclass is one too
        return True
    methods = ("has_permission", "has_object_permission")
    return isinstance(found, type) and all(callable(getattr(found, m, None)) for m in methods)


class CanChangeJobs(BasePermission):
    """The user holds ``django_delayjobs.change_job``, whatever the configured classes say."""

    message = f"Changing jobs needs the {CHANGE_PERMISSION} permission."

    def has_permission(self, request: Request, view: APIView) -> bool:
        return bool(request.user and request.user.has_perm(CHANGE_PERMISSION))


class CanViewJobs(BasePermission):
    """The user may see jobs: ``view_job`` or ``change_job``, the admin's rule."""

    message = f"Reading jobs needs the {VIEW_PERMISSION} (or {CHANGE_PERMISSION}) permission."

    def has_permission(self, request: Request, view: APIView) -> bool:
        return can_view(request)


def can_view(request: Request) -> bool:
    """The request's user may see jobs: ``view_job`` or ``change_job``, the admin's rule."""
    user = request.user
    return bool(user and (user.has_perm(VIEW_PERMISSION) or user.has_perm(CHANGE_PERMISSION)))


def permissions_for(write: bool) -> list[Any]:
    """Instantiate the permissions of one request (``write``: it changes a job)."""
    permissions = [make() for make in configured_permissions()]
    permissions.append(CanChangeJobs() if write else CanViewJobs())
    return permissions
