"""The README's quick start, followed literally: a fresh clone, then its two commands.

Slow (it builds a fresh virtual environment), and it tests what is *committed*: the clone
is ``git clone --depth 1`` of this checkout's HEAD. No Redis, no database server: both are
removed from the environment, as on a newcomer's machine. ``DELAYJOBS_QUICKSTART_SOURCE``
clones another repository instead (e.g. a commit of a work in progress).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.slow

SOURCE = Path(os.environ.get("DELAYJOBS_QUICKSTART_SOURCE") or ROOT)
#: What a newcomer's shell would not have: servers, this run's venv and settings.
DROPPED = ("REDIS_URL", "DATABASE_URL", "DJANGO_SETTINGS_MODULE", "VIRTUAL_ENV", "PYTHONPATH")


def quick_start_commands() -> list[str]:
    """The commands in the README's "Quick start" console block (comments removed)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```console\n(.*?)```", section, re.DOTALL)
    assert block, "the Quick start section has no console block"
    return [line.split("#", 1)[0].strip() for line in block[1].splitlines() if line.strip()]


def test_readme_quick_start_has_two_commands() -> None:
    assert quick_start_commands() == ["python3 dev.py demo", "python3 dev.py test"]


@pytest.mark.timeout(1200)
def test_readme_quick_start_in_a_fresh_clone(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed, so the repository cannot be cloned")
    if subprocess.run(["git", "-C", str(SOURCE), "rev-parse", "HEAD"],
                      capture_output=True).returncode != 0:  # fmt: skip
        pytest.skip(f"{SOURCE} is not a git repository with a commit to clone")
    python3 = shutil.which("python3")
    if python3 is None:
        pytest.skip("no python3 on PATH (the README's commands call python3)")
    demo, test = (shlex.split(command) for command in quick_start_commands())

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", "--depth", "1", f"file://{SOURCE}", str(clone)],
                   check=True, timeout=120)  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in DROPPED and not k.startswith("PYTEST")}
    env["DELAYJOBS_VENV"] = str(tmp_path / "venv")  # a fresh one, not the clone's .venv

    def run(args: list[str]) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(args, cwd=clone, env=env, capture_output=True, text=True,
                              timeout=900)  # fmt: skip
        sys.stdout.write(done.stdout[-3000:])  # shown when the test fails
        return done

    # 1. The demo: creates the venv, installs, runs the example shop, exits 0.
    ran = run(demo)
    detail = f"exit {ran.returncode}\n{ran.stdout[-5000:]}\n{ran.stderr[-5000:]}"
    assert ran.returncode == 0, detail
    assert "dev.py: creating" in ran.stdout, detail
    assert re.search(r"unpaid orders cancelled:\s+(\d+)/\1\b", ran.stdout), detail
    assert re.search(r"paid orders wrongly cancelled:\s+0/", ran.stdout), detail
    assert "OK: every unpaid order was cancelled" in ran.stdout, detail
    assert "private redis-server" in ran.stdout, detail

    # 2. The test command; the whole suite would run this test again, so pick one test.
    ran = run([*test, "-p", "no:cacheprovider", "tests/test_smoke_engine.py"])
    detail = f"exit {ran.returncode}\n{ran.stdout[-5000:]}\n{ran.stderr[-5000:]}"
    assert ran.returncode == 0, detail
    assert re.search(r"\b\d+ passed\b", ran.stdout), detail
    assert " failed" not in ran.stdout, detail
