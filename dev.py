#!/usr/bin/env python3
"""Project tasks that need nothing but Python 3.11+: ``python3 dev.py <task> [args]``.

  test [pytest args]   run the test suite (a private Redis is started when REDIS_URL is unset)
  demo [args]          run the example shop demo (SQLite and an embedded Redis)
  lint                 ruff check, ruff format --check, mypy, makemigrations --check
  docs                 build the documentation site with warnings as errors
  bench [args]         run bench/engine.py
  compare [args]       run bench/compare.py (delayjobs against Celery, RQ, Huey, Dramatiq)

Each task first creates (or refreshes) a virtual environment for the running Python in
``.venv/py3.X`` -- or in ``$DELAYJOBS_VENV`` -- and installs the project into it with its
``dev`` and ``embedded`` extras (or those ``$DELAYJOBS_EXTRAS`` lists: CI adds ``hiredis``
on Python 3.13, so the suite runs with both of redis-py's parsers). It is refreshed only
when ``pyproject.toml`` or the extras change.
``compare`` uses its own, ``.venv/bench-py3.X``, with ``bench/requirements.txt`` (the
peers pin versions that the development tools need not share).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
PY = f"py{sys.version_info.major}.{sys.version_info.minor}"


def venv_dir() -> Path:
    return Path(os.environ.get("DELAYJOBS_VENV") or ROOT / ".venv" / PY)


def venv_python_version(where: Path) -> str | None:
    """The "3.X" of the Python that made the venv at ``where`` (its pyvenv.cfg), or None."""
    try:
        config = (where / "pyvenv.cfg").read_text()
    except OSError:
        return None
    for line in config.splitlines():
        key, _, value = line.partition("=")
        if key.strip() in ("version", "version_info"):
            return ".".join(value.strip().split(".")[:2])
    return None


def ensure_venv(where: Path | None = None, requirements: str | None = None) -> Path:
    """Create a virtual environment and install the project; return its python.

    The default is the development venv (the extras ``$DELAYJOBS_EXTRAS`` lists, else
    ``dev`` and ``embedded``); with ``requirements``, the project with ``embedded`` plus
    that requirements file.
    """
    where = where or venv_dir()
    python = where / "bin" / "python"
    stamp = where / ".installed"
    # The stamp covers ROOT too: the install is editable, so a venv kept outside the clone
    # (CI caches one) must be reinstalled when the clone it points at moves.
    extras = os.environ.get("DELAYJOBS_EXTRAS") or "dev,embedded"
    identity = f"{ROOT}\n{extras}\n".encode() + (ROOT / "pyproject.toml").read_bytes()
    if requirements:
        identity += (ROOT / requirements).read_bytes()
    wanted = hashlib.sha256(identity).hexdigest()
    made_by, running = venv_python_version(where), f"{sys.version_info[0]}.{sys.version_info[1]}"
    if made_by and made_by != running:
        # DELAYJOBS_VENV set for one Python and used from another: its python would run
        # silently instead of this one.
        raise SystemExit(f"dev.py: {where} is a Python {made_by} environment and this is "
                         f"Python {running}: unset DELAYJOBS_VENV, or point it at an "
                         "environment of this Python")  # fmt: skip
    if stamp.exists() and stamp.read_text() == wanted and python.exists():
        return python
    if not python.exists():
        print(f"dev.py: creating {where}", flush=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(where)
    elif subprocess.run([str(python), "-m", "pip", "--version"], capture_output=True).returncode:
        # A creation interrupted during ensurepip (Ctrl-C in the first run) left no pip.
        print(f"dev.py: installing pip into {where}", flush=True)
        subprocess.run([str(python), "-m", "ensurepip", "--upgrade", "--default-pip"], check=True)
    install = ["-e", f"{ROOT}[embedded]", "-r", requirements] if requirements else [
        "-e", f"{ROOT}[{extras}]"]  # fmt: skip
    print(f"dev.py: installing {' '.join(install)} (first run takes a minute)", flush=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, *install], check=True, cwd=ROOT)
    stamp.write_text(wanted)
    return python


def run(*args: str) -> int:
    return subprocess.call(list(args), cwd=ROOT)


def run_in_place(*args: str) -> int:
    """Run the command in place of dev.py (``exec``: the same process, on POSIX).

    Ctrl-C and SIGTERM then reach the command alone, and it stops cleanly (the demo stops
    its worker and its Redis): ``subprocess.call`` SIGKILLs its child 0.25 s after a
    Ctrl-C, and a SIGTERM would end dev.py and leave the command running.
    """
    if os.name != "posix":
        return run(*args)
    sys.stdout.flush()
    os.chdir(ROOT)
    os.execv(args[0], args)


def task_test(python: Path, args: list[str]) -> int:
    return run_in_place(str(python), "-m", "pytest", *args)


def task_demo(python: Path, args: list[str]) -> int:
    return run_in_place(str(python), "example_project/manage.py", "demo", *args)


def task_lint(python: Path, args: list[str]) -> int:
    bindir = python.parent
    steps = [
        [str(bindir / "ruff"), "check", "."],
        [str(bindir / "ruff"), "format", "--check", "."],
        [str(bindir / "mypy")],
        [str(python), "-m", "django", "makemigrations", "--check", "--dry-run",
         "--settings", "tests.settings"],
    ]  # fmt: skip
    return max(run(*step) for step in steps)


def task_docs(python: Path, args: list[str]) -> int:
    mkdocs = str(python.parent / "mkdocs")
    return run_in_place(mkdocs, "build", "--strict", "--site-dir", "site", *args)


def task_bench(python: Path, args: list[str]) -> int:
    return run_in_place(str(python), "bench/engine.py", *args)


def task_compare(args: list[str]) -> int:
    python = ensure_venv(ROOT / ".venv" / f"bench-{PY}", "bench/requirements.txt")
    return run_in_place(str(python), "bench/compare.py", *args)


TASKS = {"test": task_test, "demo": task_demo, "lint": task_lint, "docs": task_docs,
         "bench": task_bench}  # fmt: skip


def main(argv: list[str]) -> int:
    if argv and argv[0] == "compare":
        return task_compare(argv[1:])
    if not argv or argv[0] not in TASKS:
        print(__doc__)
        return 2
    return TASKS[argv[0]](ensure_venv(), argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
