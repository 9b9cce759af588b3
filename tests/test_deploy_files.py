"""The files in deploy/ say what they run, and what they run exists.

Docker is not needed: the YAML files are parsed, and every Django management command the
files run (compose ``command`` and health checks, Kubernetes ``command``/``args`` and
probes, systemd ``Exec*=`` lines, the Dockerfile's ``CMD``) is looked up with Django's
``get_commands()`` under the test settings and its arguments parsed by the command's own
parser. The commands must then be Django's or django-delayjobs' own (the example shop's
are not installed in the test settings). The Dockerfile's ``COPY`` sources must exist in
the build context (the repository root), and those copied before its ``pip install`` must
build the package's wheel.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import CommandError, get_commands, load_command_class

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
EXAMPLE = ROOT / "example_project"  # the working directory of every process in deploy/


@dataclass(frozen=True)
class Invocation:
    source: str  # "deploy/docker-compose.yml: worker command"
    argv: tuple[str, ...]


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def compose_argv(value: Any) -> list[str]:
    """A compose command or health-check test as an argv."""
    if isinstance(value, str):
        return shlex.split(value)
    argv = [str(part) for part in value]
    if argv and argv[0] == "CMD-SHELL":
        return shlex.split(argv[1])
    if argv and argv[0] in ("CMD", "NONE"):
        return argv[1:]
    return argv


def compose_invocations(path: Path) -> Iterator[Invocation]:
    data = yaml.safe_load(path.read_text())
    for name, service in data["services"].items():
        for key in ("entrypoint", "command"):
            if key in service:
                yield Invocation(
                    f"{relative(path)}: {name} {key}", tuple(compose_argv(service[key]))
                )
        test = (service.get("healthcheck") or {}).get("test")
        if test:
            yield Invocation(f"{relative(path)}: {name} healthcheck", tuple(compose_argv(test)))


def exec_commands(node: Any, where: str) -> Iterator[tuple[str, list[str]]]:
    """Every ``exec: {command: [...]}`` under node (probes, lifecycle hooks)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "exec" and isinstance(value, dict) and "command" in value:
                yield where, [str(part) for part in value["command"]]
            else:
                yield from exec_commands(value, f"{where}.{key}")
    elif isinstance(node, list):
        for item in node:
            yield from exec_commands(item, where)


def kubernetes_invocations(path: Path) -> Iterator[Invocation]:
    for document in yaml.safe_load_all(path.read_text()):
        pod = document["spec"]["template"]["spec"]
        for container in pod.get("initContainers", []) + pod["containers"]:
            name = f"{relative(path)}: {container['name']}"
            argv = [*container.get("command", []), *container.get("args", [])]
            if argv:
                yield Invocation(f"{name} command", tuple(str(part) for part in argv))
            for where, command in exec_commands(container, name):
                yield Invocation(where, tuple(command))


def systemd_invocations(path: Path) -> Iterator[Invocation]:
    for line in path.read_text().splitlines():
        match = re.match(r"(Exec\w+)=(.*)", line.strip())
        if match:
            # Leading -, @, :, +, ! are systemd's prefixes, not part of the path.
            argv = shlex.split(match.group(2).lstrip("-@:+!"))
            yield Invocation(f"{relative(path)}: {match.group(1)}", tuple(argv))


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines = [
        line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")
    ]  # fmt: skip
    text = re.sub(r"\\\n", " ", "\n".join(lines))
    found = []
    for line in text.splitlines():
        if line.strip():
            instruction, _, rest = line.strip().partition(" ")
            found.append((instruction.upper(), rest.strip()))
    return found


def dockerfile_invocations(path: Path) -> Iterator[Invocation]:
    for instruction, rest in dockerfile_instructions(path):
        if instruction in ("CMD", "ENTRYPOINT"):
            argv = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
            yield Invocation(f"{relative(path)}: {instruction}", tuple(argv))


def all_invocations() -> list[Invocation]:
    found = [
        *compose_invocations(DEPLOY / "docker-compose.yml"),
        *dockerfile_invocations(DEPLOY / "Dockerfile"),
    ]
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        found += kubernetes_invocations(path)
    for path in sorted((DEPLOY / "systemd").glob("*.service")):
        found += systemd_invocations(path)
    return found


def django_command(argv: tuple[str, ...]) -> tuple[str, list[str]] | None:
    """(command, its arguments) if argv runs a Django management command, else None."""
    for i, part in enumerate(argv):
        if part.endswith("manage.py") or Path(part).name == "django-admin":
            rest = argv[i + 1 :]
        elif part == "-m" and argv[i + 1 : i + 2] == ("django",):
            rest = argv[i + 2 :]
        else:
            continue
        return (rest[0], list(rest[1:])) if rest else ("", [])
    return None


def check_command(name: str, args: list[str]) -> str | None:
    """Why `manage.py name args` would not run, or None."""
    commands = get_commands()
    if name not in commands:
        return f"no management command {name!r}"
    command = load_command_class(commands[name], name)
    parser = command.create_parser("manage.py", name)
    try:
        options = parser.parse_args(args)
    except CommandError as exc:  # the parser raises this when not run from a shell
        return f"manage.py {name} {' '.join(args)}: {exc}"
    # These two check their values in handle(), with functions that need neither Redis
    # nor the database: a probe whose --max-overdue is out of range, or a timer's prune
    # with a bad --older-than, would fail with status 2 on every run.
    try:
        if name == "delayjobs_health":
            command.limits(vars(options))
        elif name == "delayjobs_prune":
            command.checked(vars(options))
    except ValueError as exc:
        return f"manage.py {name} {' '.join(args)}: {exc}"
    return None


# -- the checker itself ----------------------------------------------------------------------


def test_the_checker_finds_django_commands_in_every_spelling() -> None:
    assert django_command(("python", "manage.py", "migrate", "--noinput")) == (
        "migrate",
        ["--noinput"],
    )
    assert django_command(("/srv/venv/bin/python", "-m", "django", "check")) == ("check", [])
    assert django_command(("django-admin", "delayjobs_stats")) == ("delayjobs_stats", [])
    assert django_command(("gunicorn", "shopsite.wsgi")) is None
    assert django_command(("python", "-c", "import django")) is None


def test_the_checker_rejects_unknown_commands_and_options() -> None:
    assert check_command("run_delayworker", ["--log-format", "json"]) is None
    assert "no management command" in (check_command("run_delayworkers", []) or "")
    assert "invalid choice" in (check_command("run_delayworker", ["--log-format", "xml"]) or "")
    assert "unrecognized" in (check_command("delayjobs_health", ["--no-such-option"]) or "")
    assert "--max-overdue" in (check_command("delayjobs_health", ["--max-overdue", "soon"]) or "")
    assert check_command("delayjobs_health", ["--max-overdue", "120"]) is None
    assert "30x" in (check_command("delayjobs_prune", ["--older-than", "30x"]) or "")
    assert check_command("delayjobs_prune", ["--older-than", "30d"]) is None
    assert "rate" in (check_command("delayjobs_prune", ["--older-than", "1d", "--max-rate", "-1"])
                      or "")  # fmt: skip


# -- deploy/ ---------------------------------------------------------------------------------


def test_yaml_files_parse() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    assert {"postgres", "redis", "migrate", "web", "worker"} <= set(compose["services"])
    # The merge key (<<: *shop) gives web and worker the shop's build and environment.
    assert compose["services"]["worker"]["build"]["dockerfile"] == "deploy/Dockerfile"
    manifests = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
    assert manifests
    for path in manifests:
        for document in yaml.safe_load_all(path.read_text()):
            assert document["apiVersion"] and document["kind"], path


def test_every_management_command_in_deploy_exists_with_its_options() -> None:
    invocations = all_invocations()
    found = {}
    for invocation in invocations:
        command = django_command(invocation.argv)
        if command is not None:
            found[invocation] = command
    # The parsing above must keep finding what the files run; an empty list proves nothing.
    named = {(inv.source.split(":")[0], command[0]) for inv, command in found.items()}
    assert {
        ("deploy/docker-compose.yml", "migrate"),
        ("deploy/docker-compose.yml", "run_delayworker"),
        ("deploy/docker-compose.yml", "delayjobs_health"),
        ("deploy/kubernetes/worker.yaml", "run_delayworker"),
        ("deploy/kubernetes/worker.yaml", "delayjobs_health"),
        ("deploy/systemd/delayjobs-worker.service", "run_delayworker"),
        ("deploy/systemd/delayjobs-prune.service", "delayjobs_prune"),
    } <= named
    problems = [
        f"{inv.source}: {problem}"
        for inv, (name, args) in found.items()
        if (problem := check_command(name, args))
    ]
    assert not problems


def test_commands_named_in_comments_exist_too() -> None:
    # Comments tell the reader what to run (the Dockerfile's "the worker runs ... with").
    problems = []
    for path in sorted(p for p in DEPLOY.rglob("*") if p.is_file()):
        for match in re.finditer(
            r"(?:manage\.py|-m django|django-admin)\s+([a-z_]+)", path.read_text()
        ):
            if match.group(1) not in get_commands():
                problems.append(f"{relative(path)}: {match.group(0)}")
    assert not problems


def test_wsgi_modules_and_settings_exist() -> None:
    wsgi = [
        inv for inv in all_invocations() if inv.argv and Path(inv.argv[0]).name == "gunicorn"
    ]  # fmt: skip
    assert len(wsgi) >= 2  # the Dockerfile's CMD and delayjobs-web.service
    for invocation in wsgi:
        module = invocation.argv[1]
        assert (EXAMPLE / (module.replace(".", "/") + ".py")).is_file(), invocation
    for instruction, rest in dockerfile_instructions(DEPLOY / "Dockerfile"):
        if instruction == "ENV":
            match = re.search(r"DJANGO_SETTINGS_MODULE=(\S+)", rest)
            assert match
            assert (EXAMPLE / (match.group(1).replace(".", "/") + ".py")).is_file()


def test_dockerfile_copies_files_that_exist() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    build = compose["services"]["worker"]["build"]
    context = (DEPLOY / build["context"]).resolve()
    assert context == ROOT
    assert (context / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
    sources = copy_sources()
    assert "django_delayjobs" in sources
    missing = [source for source in sources if not list(context.glob(source))]
    assert not missing


def copy_sources() -> list[str]:
    """The context paths the Dockerfile's COPY and ADD instructions read."""
    sources = []
    for instruction, rest in dockerfile_instructions(DEPLOY / "Dockerfile"):
        if instruction in ("COPY", "ADD"):
            parts = shlex.split(rest)
            if any(part.startswith("--from") for part in parts):
                continue  # from another stage, not the context
            sources += [part for part in parts[:-1] if not part.startswith("--")]
    return sources


def test_dockerignore_keeps_what_the_dockerfile_copies() -> None:
    patterns = [line.strip() for line in (DEPLOY / "Dockerfile.dockerignore").read_text()
                .splitlines() if line.strip() and not line.startswith("#")]  # fmt: skip
    assert ".venv" in patterns and ".git" in patterns
    for source in copy_sources():
        for pattern in patterns:
            # A source, or a directory above it, matched by a pattern would be left out.
            parts = Path(source).parts
            prefixes = [str(Path(*parts[:n])) for n in range(1, len(parts) + 1)]
            assert not any(fnmatch.fnmatch(p, pattern) for p in prefixes), (source, pattern)


def test_dockerfile_installs_extras_that_exist() -> None:
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"])  # fmt: skip
    wanted = set()
    for instruction, rest in dockerfile_instructions(DEPLOY / "Dockerfile"):
        if instruction == "RUN":
            for match in re.finditer(r"\.\[([\w,-]+)\]", rest):
                wanted |= set(match.group(1).split(","))
    assert wanted
    assert wanted <= extras


@pytest.mark.slow
def test_the_dockerfile_copies_what_pip_install_needs(tmp_path: Path) -> None:
    """The files the Dockerfile copies before its ``pip install .`` build a wheel with its
    license: without ``LICENSE`` (pyproject.toml's ``license-files``) every build warned
    "Pattern 'LICENSE' did not match any files" (an error from setuptools' 2027 releases)
    and the image's package came without the license MIT asks copies to carry."""
    from tests.test_packaging import backend_unavailable

    context = tmp_path / "context"
    for instruction, rest in dockerfile_instructions(DEPLOY / "Dockerfile"):
        if instruction == "RUN" and "pip install" in rest:
            break
        if instruction == "COPY":
            for source in shlex.split(rest)[:-1]:
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
    if result.returncode != 0:
        requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]
        reason = backend_unavailable(tmp_path, requires["requires"])
        if reason:
            pytest.skip(reason)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "did not match any files" not in result.stdout + result.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert any(name.endswith(".dist-info/licenses/LICENSE") for name in archive.namelist())


@pytest.mark.parametrize("path", sorted((DEPLOY / "systemd").glob("*.timer")), ids=str)
def test_timers_start_a_unit_that_exists(path: Path) -> None:
    unit = path.with_suffix(".service")
    text = path.read_text()
    match = re.search(r"^Unit=(\S+)", text, re.MULTILINE)
    if match:
        unit = path.parent / match.group(1)
    assert unit.is_file()
