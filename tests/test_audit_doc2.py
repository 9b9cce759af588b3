"""The docs' code runs as they show it, and what they name is what the code defines: the
shell snippet of docs/operations.md that forgets orphaned garbage, docs/metrics.md's
tables against the exposition, docs/how-it-works.md's script table against the .lua
headers, every command option (with the defaults the prose gives) against argparse, and
the names the docs import or spell out against the package."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from django_delayjobs.connection import get_engine
from django_delayjobs.models import Job

from .test_audit_doc import BASE_OPTIONS, COMMANDS, DOCS, options, parser
from .test_rest_helpers import dead_job

ROOT = Path(__file__).resolve().parent.parent


def snippet(doc: str, after: str) -> str:
    """The first Python block of ``docs/<doc>`` after the text ``after``, dedented."""
    text = (ROOT / "docs" / doc).read_text().split(after, 1)[1]
    block = re.search(r"```python\n(.*?)```", text, re.DOTALL)
    assert block is not None, f"{doc}: no python block after {after!r}"
    return textwrap.dedent(block[1])


@pytest.mark.django_db(transaction=True)
def test_the_shell_snippet_that_forgets_orphaned_garbage_runs():
    """docs/operations.md: `queues.queue_names()` returns (names, why), so the snippet's
    loop went over that pair and failed on its first name."""
    orphan = dead_job()
    kept = dead_job()
    Job.objects.filter(pk=orphan.pk).delete()  # its row deleted by hand
    exec(snippet("operations.md", "with a **Forget** button"), {})
    assert [job_id for job_id, _ in get_engine().garbage(kept.queue, 10)] == [str(kept.pk)]


def documented_metrics() -> dict[str, tuple[str, list[str]]]:
    """docs/metrics.md's tables of metrics: name -> (type, labels)."""
    text = (ROOT / "docs" / "metrics.md").read_text()
    rows = re.findall(r"^\| `(delayjobs_\w+)` \| (\w+) \|([^|]*)\|", text, re.MULTILINE)
    return {name: (kind, re.findall(r"`(\w+)`", labels)) for name, kind, labels in rows}


def test_the_metrics_tables_name_every_family_with_its_type_and_labels():
    """Every family a scrape can show (a sharded queue and a named action included) is in
    docs/metrics.md with its type and labels, the buckets as written, and no other."""
    from django_delayjobs.engine import QueueStats
    from django_delayjobs.metrics import exposition, layout
    from django_delayjobs.metrics.snapshot import QueueReading

    def stats(name: str, shards: tuple[QueueStats, ...] = ()) -> QueueStats:
        return QueueStats(name, 0, 0, 0, 0, 0, 0, 0, 1, None, None, shards=shards)

    action = "shop.Order.cancel"
    totals = {layout.action_field(action, "jobs:succeeded"): 1.0}
    reading = QueueReading("q", stats("q", (stats("q~0"), stats("q~1"))), totals, 0, (action,))
    found = {}
    for family in exposition.families([reading]):
        labels = sorted({label for s in family.samples for label in s.labels} - {"le"})
        found[family.name + ("_total" if family.type == "counter" else "")] = (
            family.type,
            labels,
        )
    documented = {
        name: (kind, sorted(labels)) for name, (kind, labels) in documented_metrics().items()
    }
    assert documented == found
    text = (ROOT / "docs" / "metrics.md").read_text()
    lateness = ", ".join(f"{b:g}" for b in layout.LATENESS_BUCKETS)
    assert f"Buckets from 1 ms to 60 s: {lateness} |" in text
    assert f"Buckets {layout.RUN_BUCKETS[0]:g} to {layout.RUN_BUCKETS[-1]:g} s" in text


def test_the_outcome_and_state_labels_are_the_documented_ones():
    """docs/metrics.md's "Outcomes, exactly" table and the states of delayjobs_queue_jobs."""
    from django_delayjobs.metrics import exposition, layout

    text = (ROOT / "docs" / "metrics.md").read_text()
    table = text.split("### Outcomes, exactly", 1)[1].split("\n\n", 2)[1]
    assert re.findall(r"^\| `(\w+)` \|", table, re.MULTILINE)[1:] == list(layout.OUTCOMES)
    row = re.search(r"^\| `delayjobs_queue_jobs` \|.*$", text, re.MULTILINE)
    assert row is not None
    assert re.findall(r"`(\w+)` \(", row[0]) == list(exposition.STATES)


def test_the_script_table_names_every_script_with_the_keys_of_its_header():
    """docs/how-it-works.md's table of scripts: each .lua file, with the keys its header
    declares (KEYS[n] = name TYPE), in order. It gave stats a ready key it is not given."""
    scripts = ROOT / "django_delayjobs" / "engine" / "scripts"
    text = (ROOT / "docs" / "how-it-works.md").read_text()
    table = text.split("| script | keys it touches | guarantee |", 1)[1].split("\n\n", 1)[0]
    documented = {}
    for row in table.splitlines()[2:]:
        _, script, keys, *_ = row.split("|")
        documented[script.strip().strip("`")] = re.findall(
            r"(\w+)(?: \([^)]*\))?(?:, |$)", keys.strip()
        )
    declared = {}
    for path in scripts.glob("*.lua"):
        keys = dict(re.findall(r"KEYS\[(\d+)\] = (\w+)", path.read_text()))
        declared[path.stem] = [keys[n] for n in sorted(keys, key=int)]
    assert documented == declared


#: The defaults the docs give in prose, each as the docs word it ({} is the default).
DEFAULTS_AS_WRITTEN = {
    ("run_delayworker", "--concurrency"): ("worker.md", "1 to 1000 (default {})"),
    ("run_delayworker", "--metrics-host"): ("worker.md", "(default host `{}`"),
    ("delayjobs_health", "--max-overdue"): ("operations.md", "`--max-overdue` seconds ({})"),
    ("delayjobs_health", "--min-workers"): ("operations.md", "`--min-workers` ({})"),
    ("delayjobs_prune", "--status"): ("operations.md", "--older-than 30d              # {}\n"),
    ("delayjobs_prune", "--batch"): ("operations.md", "(`--batch`, {} by default"),
    ("delayjobs_prune", "--max-rate"): ("operations.md", "({} jobs/s by default"),
}


def test_every_option_of_every_command_is_in_the_docs():
    """docs/worker.md's table holds run_delayworker's options (test_audit_doc); the other
    commands' options are told in prose and console blocks: each one is named."""
    text = "".join(path.read_text() for path in DOCS)
    for command in COMMANDS:
        for option in sorted(options(command) - BASE_OPTIONS):
            assert re.search(rf"{option}\b(?!-)", text), f"{command} {option}"


@pytest.mark.parametrize(("command", "option"), sorted(DEFAULTS_AS_WRITTEN))
def test_the_defaults_the_docs_give_are_the_commands(command, option):
    doc, wording = DEFAULTS_AS_WRITTEN[command, option]
    (action,) = [a for a in parser(command)._actions if option in a.option_strings]
    try:
        default = f"{float(action.default):g}"
    except ValueError:
        default = action.default.replace(",", ", ")
    assert wording.format(default) in (ROOT / "docs" / doc).read_text()


def test_the_option_table_of_schedule_names_each_of_its_options():
    """docs/scheduling.md's table under the schedule() example: every keyword of
    ``schedule``, and nothing else. ``actor=`` was left out."""
    import inspect

    from django_delayjobs import schedule

    text = (ROOT / "docs" / "scheduling.md").read_text()
    table = text.split("| option | meaning |", 1)[1].split("\n\n", 1)[0]
    documented = set()
    for row in table.splitlines()[2:]:
        documented |= set(re.findall(r"`(\w+)`", row.split("|")[1]))
    parameters = inspect.signature(schedule).parameters
    assert documented == {name for name in parameters if name != "fn"}


def test_the_signature_of_schedule_http_is_the_one_written():
    """docs/callbacks.md writes out ``schedule_http``'s parameters and their defaults."""
    import inspect

    from django_delayjobs import schedule_http

    text = " ".join((ROOT / "docs" / "callbacks.md").read_text().split())
    written = re.search(r"`schedule_http\((.*?)\) -> Job`", text)
    assert written is not None
    signature = inspect.signature(schedule_http)
    bare = signature.replace(
        parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
        return_annotation=signature.empty,
    )
    assert f"({written[1]})".replace('"', "'") == str(bare)


def test_the_settings_table_of_the_callbacks_page_gives_conf_defaults():
    """docs/callbacks.md repeats the HTTP settings (docs/settings.md's table is checked in
    test_settings_checks): each name is a setting, with conf's default."""
    import ast

    from django_delayjobs.conf import DEFAULTS

    text = (ROOT / "docs" / "callbacks.md").read_text().split("\n## Settings\n", 1)[1]
    rows = re.findall(r"^\| (`[A-Z_]+`(?:, `[A-Z_]+`)*) \| .* \| (`.*`) \|$", text, re.MULTILINE)
    assert len(rows) > 10
    for names, defaults in rows:
        written = [ast.literal_eval(d) for d in re.findall(r"`([^`]*)`", defaults)]
        assert written == [DEFAULTS[name] for name in re.findall(r"`(\w+)`", names)], names


def test_the_admin_action_table_names_every_action_of_the_job_list():
    """docs/admin.md's table of actions: each one the job list offers, by its label."""
    from django.contrib import admin

    job_admin = admin.site._registry[Job]
    labels = {str(getattr(job_admin, name).short_description) for name in job_admin.actions}
    text = (ROOT / "docs" / "admin.md").read_text()
    table = text.split("| action | service call | changes |", 1)[1].split("\n\n", 1)[0]
    assert {row.split("|")[1].strip() for row in table.splitlines()[2:]} == labels


def test_every_name_the_docs_import_or_spell_out_exists():
    """``from django_delayjobs... import X`` in a code block, and a dotted path such as
    ``django_delayjobs.logs.JsonFormatter`` anywhere: each one resolves (permissions, check
    ids and the callback action's name are not paths)."""
    import importlib

    from django_delayjobs.callbacks.action import ACTION

    def resolves(path: str) -> bool:
        parts = path.split(".")
        for i in range(len(parts), 0, -1):
            try:
                found: object = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for part in parts[i:]:
                if not hasattr(found, part):
                    return False
                found = getattr(found, part)
            return True
        return False

    text = "".join(path.read_text() for path in DOCS)
    imports = re.findall(r"^ *from (django_delayjobs[\w.]*) import ([\w, ]+)$", text, re.MULTILINE)
    paths = {f"{module}.{name.strip()}" for module, names in imports for name in names.split(",")}
    not_paths = re.compile(r"django_delayjobs\.([EW]\d{3}|\w+_job)")
    paths |= {p for p in re.findall(r"django_delayjobs(?:\.\w+)+", text) if not not_paths.match(p)}
    assert len(imports) > 10
    assert [p for p in sorted(paths - {ACTION}) if not resolves(p)] == []
