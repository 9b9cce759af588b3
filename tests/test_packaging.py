"""The package as users install it: ``python -m build``, ``twine check``, a fresh venv.

The sdist and the wheel are built once for this module, from a copy of the files git
tracks (so nothing is written into the source tree: setuptools leaves ``build/`` and
``*.egg-info`` next to the sources it builds from). ``python -m build`` without
``--sdist``/``--wheel`` builds the wheel from the unpacked sdist, as pip does with an
sdist: a file missing from the sdist is then missing from the wheel too.

The files expected in both come from ``git ls-files django_delayjobs``: a new Lua script,
template or static file that the package data misses fails here.

The build installs the build backend (setuptools) into an isolated environment with pip,
from the configured package index. The test is skipped only when that backend cannot be
obtained at all, and says so.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import tomllib
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "django_delayjobs"

pytestmark = pytest.mark.slow


def build_leftovers() -> set[str]:
    """What a build in ROOT would leave there."""
    return {p.name for p in (ROOT / "build", ROOT / "dist", *ROOT.glob("*.egg-info"))
            if p.exists()}  # fmt: skip


# Present before this module ran (a developer's own `pip wheel .`, say): not ours.
LEFTOVERS_BEFORE = build_leftovers()


def git_files(*paths: str) -> list[str]:
    """Files git tracks (and that exist in the work tree), relative to ROOT."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--", *paths],
            cwd=ROOT, capture_output=True, check=True, timeout=30,
        ).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"the package files are listed by git, and git failed here: {exc}")
    files = [name for name in out.decode().split("\0") if name]
    return [
        name for name in files
        if (ROOT / name).is_file() and "__pycache__" not in name and not name.endswith(".pyc")
    ]  # fmt: skip


@dataclass
class Built:
    source: Path
    wheel: Path
    sdist: Path
    dist_name: str  # "django_delayjobs-0.1.0.dev0"


def backend_unavailable(tmp: Path, requires: list[str]) -> str | None:
    """Why the build backend cannot be obtained, or None when pip can get it."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
         "--dest", str(tmp / "backend"), *requires],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if result.returncode == 0:
        return None
    return f"pip cannot download the build backend {requires}: {result.stderr.strip()[-800:]}"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    tmp = tmp_path_factory.mktemp("packaging")
    source = tmp / "source"
    for name in git_files():
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    outdir = tmp / "dist"
    result = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(outdir), str(source)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    if result.returncode != 0:
        pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
        reason = backend_unavailable(tmp, pyproject["build-system"]["requires"])
        if reason:
            pytest.skip(reason)
        pytest.fail(f"python -m build failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    wheels = sorted(outdir.glob("*.whl"))
    sdists = sorted(outdir.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in outdir.iterdir())
    dist_name = sdists[0].name.removesuffix(".tar.gz")
    return Built(source=source, wheel=wheels[0], sdist=sdists[0], dist_name=dist_name)


def test_wheel_holds_every_tracked_file_of_the_package(built: Built) -> None:
    expected = set(git_files(PACKAGE))
    assert {f"{PACKAGE}/engine/scripts/add.lua", f"{PACKAGE}/py.typed"} <= expected
    assert any(name.startswith(f"{PACKAGE}/templates/") for name in expected)
    assert any(name.startswith(f"{PACKAGE}/migrations/0001") for name in expected)
    with zipfile.ZipFile(built.wheel) as wheel:
        names = set(wheel.namelist())
        missing = sorted(expected - names)
        assert not missing, f"tracked but not in the wheel: {missing}"
        # Same bytes as the sources (the Lua scripts are loaded as they are).
        changed = [name for name in expected if wheel.read(name) != (ROOT / name).read_bytes()]
        assert not changed
    dist_info = f"{built.dist_name}.dist-info"
    # Nothing but the package and its metadata: no tests/, example_project/, bench/.
    assert {name.split("/")[0] for name in names} == {PACKAGE, dist_info}
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]
    assert f"{dist_info}/licenses/LICENSE" in names


def test_sdist_holds_the_package_and_the_project_files(built: Built) -> None:
    prefix = f"{built.dist_name}/"
    with tarfile.open(built.sdist) as sdist:
        names = {name.removeprefix(prefix) for name in sdist.getnames()}
    expected = set(git_files(PACKAGE)) | {"README.md", "LICENSE", "pyproject.toml", "PKG-INFO"}
    missing = sorted(expected - names)
    assert not missing, f"not in the sdist: {missing}"
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]
    # setuptools adds tests/test_*.py by default, without what they need to run.
    assert not [name for name in names if name.startswith("tests/")]


def test_twine_check_passes(built: Built) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(built.sdist), str(built.wheel)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASSED") == 2, result.stdout


def test_wheel_installs_into_a_fresh_venv_with_its_lua_scripts(
    built: Built, tmp_path: Path
) -> None:
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env)
    python = env / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--no-index", str(built.wheel)],
        check=True, timeout=120,
    )  # fmt: skip
    # -I: no PYTHONPATH, no user site, not the current directory; and the current
    # directory is outside the repository anyway, so only the installed copy can answer.
    script = textwrap.dedent(
        """
        import json, importlib.metadata, importlib.resources
        import django_delayjobs
        root = importlib.resources.files("django_delayjobs")
        print(json.dumps({
            "file": django_delayjobs.__file__,
            "add": root.joinpath("engine/scripts/add.lua").read_text(),
            "scripts": sorted(p.name for p in root.joinpath("engine/scripts").iterdir()),
            "migrations": sorted(p.name for p in root.joinpath("migrations").iterdir()
                                 if p.name.endswith(".py")),
            "template": root.joinpath(
                "templates/admin/django_delayjobs/queues.html").is_file(),
            "version": importlib.metadata.version("django-delayjobs"),
        }))
        """
    )
    run = subprocess.run(
        [str(python), "-I", "-c", script],
        cwd=tmp_path, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    assert Path(found["file"]).resolve().is_relative_to(env.resolve())
    assert found["add"] == (ROOT / PACKAGE / "engine/scripts/add.lua").read_text()
    tracked = {Path(name).name for name in git_files(f"{PACKAGE}/engine/scripts")}
    assert set(found["scripts"]) == tracked
    tracked_migrations = {Path(name).name for name in git_files(f"{PACKAGE}/migrations")}
    assert set(found["migrations"]) == tracked_migrations
    assert found["template"] is True
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert found["version"] == pyproject["project"]["version"]


def test_the_build_left_the_source_tree_alone(built: Built) -> None:
    # The fixture builds from a copy in a temp dir: nothing may appear next to the sources.
    assert built.source.resolve() != ROOT
    assert build_leftovers() - LEFTOVERS_BEFORE == set()
    assert (built.source / f"{PACKAGE}.egg-info").exists()  # the build did write there


# -- install commands ----------------------------------------------------------------------

#: ``pip install 'django-delayjobs[x]'``: a requirement by name alone, which pip looks up on
#: PyPI (``... @ git+URL`` and a path are fine).
FROM_PYPI = re.compile(
    r"""pip install (['"]?)django-delayjobs(\[[^\]]*\])?\1(?=[\s`)]|$)(?!\s*@)"""
)


def test_no_install_command_looks_for_this_project_on_pypi():
    """django-delayjobs is not on PyPI ("install it from a clone", says the README), yet
    docs/callbacks.md, metrics.md, tasks.md, api.md, the README's metrics line and the
    messages for a missing extra (metrics/, run_delayworker --metrics-port, HTTP callbacks,
    the embedded Redis, the example's DATABASE_URL) said ``pip install
    'django-delayjobs[...]'``: "No matching distribution found", or, once someone else
    takes the name there, their package."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    files += sorted((ROOT / "django_delayjobs").rglob("*.py"))
    files += sorted((ROOT / "example_project").rglob("*.py"))
    found = [
        f"{path.relative_to(ROOT)}: {match[0]}"
        for path in files
        for match in FROM_PYPI.finditer(path.read_text())
    ]
    assert found == []
