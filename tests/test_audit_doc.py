"""README.md and docs/ stay true to the code: the command lines they show parse with the
commands' own parsers, the option and check tables name what the code defines, and a log
line they quote is the one the worker writes."""

from __future__ import annotations

import argparse
import ast
import json
import re
import shlex
from pathlib import Path

import pytest
from django.core.management import load_command_class
from django.core.management.base import BaseCommand, CommandError

from django_delayjobs import checks
from django_delayjobs.execution import describe

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMANDS = (
    "run_delayworker", "delayjobs_reconcile", "delayjobs_stats", "delayjobs_prune",
    "delayjobs_health",
)  # fmt: skip
#: Django's own options, which every command has.
BASE_OPTIONS = frozenset(
    s for a in BaseCommand().create_parser("manage.py", "x")._actions for s in a.option_strings
)


def parser(command: str) -> argparse.ArgumentParser:
    return load_command_class("django_delayjobs", command).create_parser("manage.py", command)


def options(command: str) -> set[str]:
    return {s for action in parser(command)._actions for s in action.option_strings}


def console_lines() -> list[tuple[str, str, str]]:
    """(file, command, its arguments) of every ``manage.py <command> ...`` line in a
    console block of the README or the docs."""
    found = []
    for path in DOCS:
        for block in re.findall(r"```console\n(.*?)```", path.read_text(), re.DOTALL):
            for line in block.replace("\\\n", " ").splitlines():
                if "manage.py" not in line:
                    continue
                words = shlex.split(line.removeprefix("$ "), comments=True)
                for i, word in enumerate(words[:-1]):
                    if word.endswith("manage.py") and words[i + 1] in COMMANDS:
                        found.append((path.name, words[i + 1], shlex.join(words[i + 2 :])))
    return found


def test_docs_show_command_lines():
    """The check below has lines to check (a changed block format would empty it)."""
    assert {command for _, command, _ in console_lines()} >= {
        "run_delayworker", "delayjobs_stats", "delayjobs_reconcile", "delayjobs_prune",
        "delayjobs_health",
    }  # fmt: skip


@pytest.mark.parametrize(("doc", "command", "arguments"), console_lines())
def test_every_command_line_in_the_docs_parses(doc, command, arguments):
    """What a reader copies from a console block is accepted by the command's parser:
    its options exist and their values have the right type."""
    try:
        parser(command).parse_args(shlex.split(arguments))
    except CommandError as exc:
        pytest.fail(f"{doc}: manage.py {command} {arguments}: {exc}")


def test_every_option_named_after_a_command_in_the_docs_exists():
    """``run_delayworker --metrics-port`` and the like, in prose and tables too."""
    one_option = r"[ ]+--[a-z][a-z-]*(?:[ =][^\s`|#-]\S*)?"  # an option and maybe its value
    pattern = re.compile(r"\b(" + "|".join(COMMANDS) + rf")((?:{one_option})+)")
    seen = 0
    for path in DOCS:
        for command, rest in pattern.findall(path.read_text()):
            for option in re.findall(r"--[a-z][a-z-]*", rest):
                seen += 1
                assert option in options(command), f"{path.name}: {command} {option}"
    assert seen > 20


def test_the_worker_option_table_names_every_option_of_run_delayworker():
    """docs/worker.md's table of options: each one exists, and none is left out."""
    text = (ROOT / "docs" / "worker.md").read_text()
    table = text.split("| option | meaning |", 1)[1].split("\n\n", 1)[0]
    documented = set()
    for row in table.splitlines()[2:]:
        first_cell = row.split("|")[1]
        documented |= {code.split()[0] for code in re.findall(r"`([^`]+)`", first_cell)}
    own = options("run_delayworker") - BASE_OPTIONS
    assert documented - {"-v"} == own


def _check_ids() -> set[str]:
    """Every check id checks.py can report, read off its source."""
    tree = ast.parse(Path(checks.__file__).read_text())
    numbers = set(checks._IDS.values())
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        if node.func.id == "_error" and isinstance(node.args[-1], ast.Constant):
            numbers.add(node.args[-1].value)
        for keyword in node.keywords:
            if keyword.arg == "id" and isinstance(keyword.value, ast.Constant):
                found.add(keyword.value.value.removeprefix("django_delayjobs."))
    return found | {f"E{n:03d}" for n in numbers}


def test_the_system_checks_table_names_every_check_id():
    """docs/settings.md's table of system checks lists each id the checks report."""
    text = (ROOT / "docs" / "settings.md").read_text().split("## System checks", 1)[1]
    documented = set()
    for row in re.findall(r"^\| (.*?) \|", text, re.MULTILINE)[1:]:
        codes = re.findall(r"`([^`]+)`", row)
        documented |= {code.removeprefix("django_delayjobs.") for code in codes}
    assert documented == _check_ids()


def test_the_json_log_example_shows_the_line_the_worker_writes():
    """docs/operations.md's JSON log line of a dead job: the message starts its reason
    with the exception's class path, as ``execution.describe`` writes it."""
    text = (ROOT / "docs" / "operations.md").read_text()
    block = text.split("`run_delayworker --log-format json`", 1)[1]
    line = re.search(r"```json\n(.*?)\n```", block, re.DOTALL)
    assert line is not None
    entry = json.loads(line[1])
    reason = re.fullmatch(r"job \S+: dead \((.*)\)", entry["message"])
    assert reason is not None
    cls, _, message = reason[1].partition(": ")
    exc_type = {"RuntimeError": RuntimeError}.get(cls.rsplit(".", 1)[-1])
    assert exc_type is not None, cls
    assert reason[1] == describe(exc_type(message)).splitlines()[0]


def test_a_capped_backoff_keeps_its_jitter(settings):
    """docs/worker.md: the backoff is capped at RETRY_BACKOFF_MAX_SECONDS, then times
    0.5-1.0, so retries past the cap still spread from half the cap to all of it."""
    from django_delayjobs.outcomes import backoff_seconds

    settings.DELAYJOBS = {"RETRY_BACKOFF_SECONDS": 10, "RETRY_BACKOFF_MAX_SECONDS": 20}
    delays = [backoff_seconds(10) for _ in range(200)]  # 10 * 2**9, far past the cap
    assert all(10 <= d <= 20 for d in delays)
    assert min(delays) < 15 < max(delays)
