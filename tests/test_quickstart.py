"""The README's quick start, followed literally: a fresh clone, then its two commands.

Slow (it builds a fresh virtual environment), and it tests what is *committed*: the clone
is ``git clone --depth 1`` of this checkout's HEAD. No Redis, no database server: both are
removed from the environment, as on a newcomer's machine. ``DELAYJOBS_QUICKSTART_SOURCE``
clones another repository instead (e.g. a commit of a work in progress).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import venv
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
    # The forged reminder's 401 is expected: the shop's warning for it would read as a failure.
    assert "Unauthorized" not in ran.stdout + ran.stderr, detail

    # 2. The test command; the whole suite would run this test again, so pick one test.
    ran = run([*test, "-p", "no:cacheprovider", "tests/test_smoke_engine.py"])
    detail = f"exit {ran.returncode}\n{ran.stdout[-5000:]}\n{ran.stderr[-5000:]}"
    assert ran.returncode == 0, detail
    assert re.search(r"\b\d+ passed\b", ran.stdout), detail
    assert " failed" not in ran.stdout, detail


# -- dev.py ----------------------------------------------------------------------------

#: A stand-in for the venv's python: ready at once, 1.5 s to clean up after a signal.
COMMAND = """
import pathlib, signal, sys, time
here = pathlib.Path(sys.argv[0]).parent
def stop(signum, frame):
    time.sleep(1.5)  # the demo stops its worker and its Redis
    (here / "cleaned").write_text(str(signum))
    sys.exit(1)
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
(here / "ready").write_text("")
time.sleep(120)
"""

#: dev.py's demo task, with ensure_venv returning the stand-in (no install).
DRIVER = """
import sys
from pathlib import Path
sys.path.insert(0, {root!r})
import dev
dev.ensure_venv = lambda *args, **kwargs: Path({python!r})
sys.exit(dev.main(["demo"]))
"""


def start_dev_py(tmp_path: Path) -> subprocess.Popen[str]:
    python = tmp_path / "python"
    python.write_text(f"#!{sys.executable}\n{COMMAND}")
    python.chmod(0o755)
    driver = DRIVER.format(root=str(ROOT), python=str(python))
    process = subprocess.Popen(
        [sys.executable, "-c", driver], cwd=ROOT, start_new_session=True, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not (tmp_path / "ready").exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.02)
    return process


def end_group(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.communicate()


@pytest.mark.timeout(60)
def test_ctrl_c_on_dev_py_lets_the_command_clean_up(tmp_path):
    """Ctrl-C on ``python3 dev.py demo`` reaches dev.py and the demo (one process group);
    dev.py's ``subprocess.call`` then SIGKILLed the demo 0.25 s later, in the middle of
    stopping its worker and Redis (its directory was left in /tmp), and printed a
    KeyboardInterrupt traceback of its own."""
    process = start_dev_py(tmp_path)
    try:
        os.killpg(process.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        process.wait(20)
        deadline = time.monotonic() + 10
        while not (tmp_path / "cleaned").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "cleaned").exists(), "the command was killed while cleaning up"
        assert "Traceback" not in process.communicate()[1]
    finally:
        end_group(process)


@pytest.mark.timeout(60)
def test_sigterm_to_dev_py_reaches_the_command(tmp_path):
    """SIGTERM to ``python3 dev.py demo`` ended dev.py alone: the demo ran on, unsignalled,
    with no parent (a supervisor or CI that stops the quick start by pid stopped nothing)."""
    process = start_dev_py(tmp_path)
    try:
        process.send_signal(signal.SIGTERM)
        process.wait(20)
        deadline = time.monotonic() + 10
        while not (tmp_path / "cleaned").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "cleaned").read_text() == str(int(signal.SIGTERM))
    finally:
        end_group(process)


@pytest.mark.timeout(300)
def test_dev_py_repairs_a_venv_left_without_pip(tmp_path):
    """Ctrl-C during the first run's "dev.py: creating ..." (ensurepip takes seconds)
    leaves a venv with a python but no pip. Every later run then failed with "No module
    named pip" (a traceback), for ever: dev.py created the venv only when its python was
    missing. Here the install itself cannot succeed (no package index), but pip must be
    there again."""
    where = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(where)  # an interrupted creation
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(DELAYJOBS_VENV=str(where), PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path))
    done = subprocess.run([sys.executable, str(ROOT / "dev.py"), "lint"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=240)  # fmt: skip
    assert "No module named pip" not in done.stderr, done.stderr
    pip = subprocess.run([str(where / "bin" / "python"), "-m", "pip", "--version"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert pip.returncode == 0, pip.stderr


def test_dev_py_refuses_a_venv_of_another_python(tmp_path):
    """``DELAYJOBS_VENV`` set for one Python and used from another (say the 3.11 venv, run
    under 3.13) ran the tests on the venv's Python without a word."""
    where = tmp_path / "venv"
    where.mkdir()
    (where / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 2.7.18\n")
    env = {**os.environ, "DELAYJOBS_VENV": str(where)}
    done = subprocess.run([sys.executable, str(ROOT / "dev.py"), "test"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1
    assert "is a Python 2.7 environment and this is Python 3." in done.stderr
    assert not (where / "bin").exists()  # nothing created or installed there
