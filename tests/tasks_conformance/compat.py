"""``django.tasks`` for Django's test files on Django 5.2, where the backport provides it.

Django's test modules say ``from django.tasks.exceptions import InvalidTask``; the
``django-tasks`` backport is ``django_tasks`` and names two exceptions differently
(``InvalidTaskError``, ``InvalidTaskBackendError``). ``serve_backport`` puts stand-in
modules named ``django.tasks...`` in ``sys.modules`` while Django's test files are imported;
their attributes are the backport's own objects (plus the two aliases), so the tests run
the backport's code, unchanged. The backport also logs to ``django_tasks`` where Django
logs to ``django.tasks`` (which the tests watch with ``assertLogs``):
``forward_backport_logs`` passes its records on. Nothing of the backport is modified.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
import types
from collections.abc import Iterator

#: django.tasks module -> the backport's module of the same role.
MODULES = {
    "django.tasks": "django_tasks",
    "django.tasks.base": "django_tasks.base",
    "django.tasks.exceptions": "django_tasks.exceptions",
    "django.tasks.signals": "django_tasks.signals",
    "django.tasks.backends": "django_tasks.backends",
    "django.tasks.backends.base": "django_tasks.backends.base",
    "django.tasks.backends.dummy": "django_tasks.backends.dummy",
    "django.tasks.backends.immediate": "django_tasks.backends.immediate",
}

#: Django's name -> the backport's name, where they differ.
RENAMED = {"InvalidTask": "InvalidTaskError", "InvalidTaskBackend": "InvalidTaskBackendError"}


def native() -> bool:
    """True when Django itself has ``django.tasks`` (Django 6.0+)."""
    try:
        importlib.import_module("django.tasks")
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def serve_backport() -> Iterator[None]:
    """Serve ``django.tasks...`` from the backport for the imports made inside."""
    added = []
    for name, source in MODULES.items():
        if name in sys.modules:
            continue
        real = importlib.import_module(source)
        stand_in = types.ModuleType(name, real.__doc__)
        stand_in.__dict__.update({k: v for k, v in vars(real).items() if not k.startswith("__")})
        for django_name, backport_name in RENAMED.items():
            if hasattr(real, backport_name):
                setattr(stand_in, django_name, getattr(real, backport_name))
        sys.modules[name] = stand_in
        added.append(name)
    try:
        yield
    finally:
        for name in added:
            del sys.modules[name]


class _Forward(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger("django.tasks").handle(record)


@contextlib.contextmanager
def forward_backport_logs() -> Iterator[None]:
    """Hand every record of the backport's ``django_tasks`` logger to ``django.tasks``."""
    source = logging.getLogger("django_tasks")
    handler, level = _Forward(), source.level
    source.addHandler(handler)
    source.setLevel(logging.DEBUG)  # the level that matters is the one on django.tasks
    try:
        yield
    finally:
        source.removeHandler(handler)
        source.setLevel(level)
