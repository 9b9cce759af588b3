"""Django's own ``tests/tasks``, taken from a Django sdist through pip and cached.

Nothing of Django's test suite is committed here: the first run downloads the sdist of
the Django version under test (``pip download --no-binary :all: --no-deps``), keeps only
``tests/tasks/`` in a cache outside the clone, and later runs read the cache. Without
network, the conformance tests are skipped and say why.

Django 5.2 has no ``django.tasks`` and its sdist no ``tests/tasks``: there the API comes
from the ``django-tasks`` backport, whose sdist ships no tests (its tests live only in its
git repository, which pip cannot reach). That line runs the tests of the Django release
named by ``BACKPORT_TESTS_FROM`` instead, with ``django.tasks`` served by the backport
(see ``compat.py``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import django

#: The Django release whose ``tests/tasks`` run against the ``django-tasks`` backport (on
#: Django 5.2). The backport 0.12 mirrors Django 6.1's ``django.tasks`` (its ``Task`` has
#: 6.1's defaults and ``**kwargs``); see docs/tasks.md for what differs.
BACKPORT_TESTS_FROM = "6.0.10"

PIP_TIMEOUT_SECONDS = 300


class Unavailable(Exception):
    """The sdist could not be had (offline, say): the conformance tests skip, with this."""


def cache_root() -> Path:
    """Where extracted test directories are kept (``DELAYJOBS_SDIST_CACHE`` overrides)."""
    configured = os.environ.get("DELAYJOBS_SDIST_CACHE")
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "django-delayjobs" / "django-sdist"


def tests_version() -> str:
    """The Django version whose tests run: the installed one, or the backport's mirror."""
    if django.VERSION >= (6, 0):
        return django.get_version()
    return BACKPORT_TESTS_FROM


def tests_dir(version: str) -> Path:
    """Return a directory holding Django ``version``'s ``tasks`` test package.

    The returned directory goes on ``sys.path`` so that the package imports as ``tasks``,
    as in Django's own runner (its tests assert ``module_path == "tasks.tasks.noop_task"``).
    """
    root = cache_root() / f"Django-{version}"
    if (root / "tasks" / "__init__.py").is_file() and (root / ".complete").is_file():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent, prefix=".download-") as tmp:
        archive = _download(version, Path(tmp))
        staged = Path(tmp) / "staged"
        _extract_tasks(archive, version, staged)
        (staged / ".complete").write_text(f"{archive.name}\n")
        try:
            staged.rename(root)
        except OSError:  # another run put it there first, or a stale partial copy is there
            if not (root / ".complete").is_file():
                shutil.rmtree(root, ignore_errors=True)
                staged.rename(root)
    return root


def _download(version: str, into: Path) -> Path:
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
        "--no-binary", ":all:", "--no-deps", "--retries", "1", "--timeout", "20",
        # The backport line runs Python 3.11; Django 6's sdist says it needs 3.12, but only
        # its tests are read here, never installed.
        "--ignore-requires-python",
        "--dest", str(into), f"Django=={version}",
    ]  # fmt: skip
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=PIP_TIMEOUT_SECONDS, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"pip download Django=={version} did not finish: {exc}") from exc
    archives = sorted(into.glob("*.tar.gz"))
    if done.returncode != 0 or not archives:
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
        last = (errors or done.stderr.strip().splitlines() or ["no output"])[-1]
        raise Unavailable(
            f"could not download the Django {version} sdist with pip (offline?): {last}"
        )
    return archives[0]


def _extract_tasks(archive: Path, version: str, staged: Path) -> None:
    """Copy ``<sdist>/tests/tasks/*`` into ``staged/tasks``; nothing else of the sdist."""
    prefix = f"django-{version}/tests/tasks/".lower()
    target = staged / "tasks"
    target.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        members = [
            m for m in tar.getmembers()
            if m.isfile() and m.name.lower().startswith(prefix)
            and "/" not in m.name[len(prefix):]
        ]  # fmt: skip
        for member in members:
            source = tar.extractfile(member)
            assert source is not None
            (target / member.name[len(prefix) :]).write_bytes(source.read())
    if not (target / "__init__.py").is_file():
        raise Unavailable(f"the Django {version} sdist has no tests/tasks package")
