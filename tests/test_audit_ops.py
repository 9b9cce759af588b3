"""Audit of the operations side (commands, health): reproductions that fail today."""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

pytestmark = pytest.mark.django_db(transaction=True)


def health(*args: str) -> tuple[int, list[str]]:
    out = StringIO()
    try:
        call_command("delayjobs_health", *args, stdout=out)
        code = 0
    except CommandError as exc:
        code = exc.returncode
    return code, out.getvalue().splitlines()


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
