"""Turn Django's task test classes into classes that run against ``DelayJobsBackend``.

For each test class of Django's ``tests/tasks`` modules this makes a subclass that

- is a ``TransactionTestCase`` (Django's are mostly ``SimpleTestCase``, which forbids the
  database; the worker of the "immediate" role needs committed rows, so no
  ``TestCase`` transaction around the test either);
- keeps every installed app available (Django's ``TransactionTestCase`` classes say
  ``available_apps = []``, which would hide delayjobs' own tables);
- has Django's Dummy and Immediate backends played by ``DelayJobsBackend`` (``roles``).

Nothing else changes: the test methods, their ``override_settings`` and assertions are
Django's, as downloaded.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
import unittest
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.test import TransactionTestCase, override_settings

from . import compat
from .roles import backends_played_by_delayjobs

#: Django's test modules that do not test a backend a project configures: each defines
#: and tests its own backend classes (custom ``BaseTaskBackend`` subclasses), so running
#: them here would test Django, not delayjobs.
NOT_APPLICABLE_MODULES = {
    "test_custom_backend": "defines its own CustomBackend classes and tests those",
}


class Conformance:
    """Mixed in first: runs a Django test class against ``DelayJobsBackend``."""

    available_apps = None

    @classmethod
    def setUpClass(cls) -> None:
        cls.enterClassContext(backends_played_by_delayjobs())  # type: ignore[attr-defined]
        if not compat.native():
            cls.enterClassContext(compat.forward_backport_logs())  # type: ignore[attr-defined]
        super().setUpClass()  # type: ignore[misc]

    @contextlib.contextmanager
    def subTest(self, msg: Any = None, **params: Any) -> Iterator[None]:
        """One Django test method is one result: a failing subtest fails its method.

        (pytest reports subtests apart from their test, and a strict xfail cannot cover
        a test whose subtests partly pass.) The failure names the subtest.
        """
        try:
            yield
        except Exception as exc:
            exc.add_note(f"in subTest {msg!r} {params or ''}".rstrip())
            raise


def load(root: Path) -> list[type[unittest.TestCase]]:
    """Import Django's task tests from ``root`` and return the conformance classes."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    classes = []
    with _as_in_djangos_runner():
        names = sorted(p.stem for p in (root / "tasks").glob("test_*.py"))
        for name in names:
            if name in NOT_APPLICABLE_MODULES:
                continue
            module = importlib.import_module(f"tasks.{name}")
            classes += [_conformance_class(cls) for cls in _test_classes(module)]
    return classes


def _test_classes(module: Any) -> list[type[unittest.TestCase]]:
    return [
        cls for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, unittest.TestCase) and cls.__module__ == module.__name__
    ]  # fmt: skip


def _conformance_class(cls: type[unittest.TestCase]) -> type[unittest.TestCase]:
    attrs = {"__module__": "tests.tasks_conformance.test_django_tasks", "__doc__": cls.__doc__,
             "__qualname__": cls.__name__}  # fmt: skip
    return type(cls.__name__, (Conformance, cls, TransactionTestCase), attrs)


@contextlib.contextmanager
def _as_in_djangos_runner() -> Iterator[None]:
    """Import as Django's runner does: its default ``TASKS`` (the immediate backend), and
    on Django 5.2 ``django.tasks`` served by the backport. ``@task`` validates each task
    against the default backend while the module is imported."""
    package = "django.tasks" if compat.native() else "django_tasks"
    default = {"default": {"BACKEND": f"{package}.backends.immediate.ImmediateBackend"}}
    serve = contextlib.nullcontext() if compat.native() else compat.serve_backport()
    with serve, override_settings(TASKS=default):
        yield
