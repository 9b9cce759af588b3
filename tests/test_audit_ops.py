"""Audit of the operations side (commands, health): reproductions that fail today."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import zipfile
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from django_delayjobs.connection import get_engine
from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.models import Job, Status

pytestmark = pytest.mark.django_db(transaction=True)


def health(*args: str) -> tuple[int, list[str]]:
    out = StringIO()
    try:
        call_command("delayjobs_health", *args, stdout=out)
        code = 0
    except CommandError as exc:
        code = exc.returncode
    return code, out.getvalue().splitlines()


def test_reconcile_does_not_wait_for_a_frozen_redis_chunk_after_chunk(tmp_path, settings):
    """A full pass against a Redis that accepts connections and never answers waited for
    the socket timeouts of every 1000-job chunk in turn (about 2 s each: 100,000 waiting
    jobs, over 3 minutes) before its one-line error: ``delayjobs_reconcile`` hung."""
    now = timezone.now()
    Job.objects.bulk_create(
        Job(queue="default", action="tests.nothing", run_at=now + timedelta(hours=1),
            status=Status.SCHEDULED)
        for _ in range(6000)
    )  # fmt: skip
    server = EmbeddedRedis(tmp_path / "redis")
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": server.start()}
    get_engine().known_queues()  # connected while it answers
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(CommandError, match="unreachable"):
            call_command("delayjobs_reconcile", stdout=StringIO())
        elapsed = time.monotonic() - started
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.close()
    assert elapsed < 5, elapsed


@pytest.mark.slow
def test_the_dockerfile_copies_what_pip_install_needs(tmp_path):
    """The Dockerfile copies ``pyproject.toml``, ``README.md`` and the package before
    ``pip install ".[http,metrics]"``, but not ``LICENSE``, which pyproject.toml's
    ``license-files`` names: every build warned ``Pattern 'LICENSE' did not match any
    files`` and the image's package came without its license (which MIT asks copies to
    carry)."""
    import sys

    from tests.test_deploy_files import DEPLOY, ROOT, dockerfile_instructions

    context = tmp_path / "context"
    for instruction, rest in dockerfile_instructions(DEPLOY / "Dockerfile"):
        if instruction == "RUN" and "pip install" in rest:
            break
        if instruction == "COPY":
            for source in rest.split()[:-1]:
                for path in ROOT.glob(source):
                    target = context / path.relative_to(ROOT)
                    if path.is_dir():
                        shutil.copytree(path, target, ignore=shutil.ignore_patterns(
                            "__pycache__", "*.pyc"))  # fmt: skip
                    else:
                        target.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(path, target)
    result = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"),
         str(context)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "did not match any files" not in result.stdout + result.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert any(name.endswith(".dist-info/licenses/LICENSE") for name in archive.namelist())
