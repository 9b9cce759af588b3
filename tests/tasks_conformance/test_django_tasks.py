"""Django's own ``tests/tasks`` cases, run against ``DelayJobsBackend``.

The test classes below are Django's (downloaded with pip, see ``sdist.py``), made to run
against delayjobs by ``harness.py``. The tests expected to fail are listed, with the
reason for each, in ``expected.py``; they run as strict xfails (``conftest.py``), so an
unexpected pass fails the run too. ``pytest --runxfail`` shows the raw pass/fail counts.

Without network (and no cached copy) the module is skipped, saying why; with
``DELAYJOBS_TASKS_REQUIRED=1`` (CI sets it) that is a collection error instead, so a CI
run cannot pass without having run them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from . import harness, sdist
from .expected import expected_failures

try:
    _ROOT = sdist.tests_dir(sdist.tests_version())
except sdist.Unavailable as exc:
    if os.environ.get("DELAYJOBS_TASKS_REQUIRED") == "1":
        pytest.fail(f"Django's task tests are required but unavailable: {exc}", pytrace=False)
    pytest.skip(f"Django's task tests are unavailable: {exc}", allow_module_level=True)

CLASSES = harness.load(_ROOT)
globals().update({cls.__name__: cls for cls in CLASSES})

DOCS = Path(__file__).resolve().parents[2] / "docs" / "tasks.md"


def _collected() -> set[str]:
    return {
        f"{cls.__name__}.{name}"
        for cls in CLASSES
        for name in dir(cls)
        if name.startswith("test") and callable(getattr(cls, name))
    }


def test_every_expected_failure_is_a_test_that_runs_here() -> None:
    """A listed name that is not one of Django's tests here is a stale entry."""
    assert not set(expected_failures()) - _collected()


def test_docs_list_every_expected_failure() -> None:
    """docs/tasks.md names each expected failure (the reader's copy of the list)."""
    documented = set(re.findall(r"`(\w+\.test_\w+)`", DOCS.read_text()))
    assert not set(expected_failures()) - documented
