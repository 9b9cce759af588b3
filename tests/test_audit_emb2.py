"""Audit of the embedded Redis, the example shop and the health endpoint, round 2."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.test_example import kill_all, wait_gone

LINUX = sys.platform.startswith("linux")

# -- a child started as its owner dies ----------------------------------------------------

#: Starts a redis-server with ``start_server``, whose child kills this program (SIGKILL)
#: before it asks for PR_SET_PDEATHSIG: the owner dies between the fork and the prctl.
OWNER_DIES_AT_FORK = textwrap.dedent(
    """
    import os, signal, sys, time
    from django_delayjobs import embedded

    asks = embedded.die_with_owner

    def owner_dies_first():
        preexec = asks()
        def run():
            owner = os.getppid()
            with open(sys.argv[2], "w") as out:
                out.write(str(os.getpid()))
            os.kill(owner, signal.SIGKILL)
            while os.getppid() == owner:  # until this child is someone else's
                time.sleep(0.001)
            preexec()
        return run

    embedded.die_with_owner = owner_dies_first
    embedded.start_server([embedded.find_redis_server(), "--port", "0", "--unixsocket",
                           sys.argv[1], "--save", ""])
    """
)


@pytest.mark.skipif(not LINUX, reason="PR_SET_PDEATHSIG is Linux's")
def test_a_redis_server_whose_owner_dies_as_it_starts_does_not_run_on(tmp_path: Path) -> None:
    """The owner killed between the fork and the child's PR_SET_PDEATHSIG: the kernel
    sends that signal when the parent dies *after* the prctl, never for a parent already
    gone, so the redis-server ran on for ever (an orphan holding its socket, with nobody
    to stop it). The child now looks again after the prctl and exits if its owner is
    gone."""
    pid_file = tmp_path / "server.pid"
    done = subprocess.run(  # no pipes: the server would hold them open
        [sys.executable, "-c", OWNER_DIES_AT_FORK, str(tmp_path / "redis.sock"), pid_file],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30,
    )  # fmt: skip
    assert done.returncode == -signal.SIGKILL
    server = int(pid_file.read_text())
    try:
        assert wait_gone([server], 5) == []
        assert not (tmp_path / "redis.sock").exists()
    finally:
        kill_all([server])
