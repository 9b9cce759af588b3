"""The schema the migrations build: no index that another already serves, the migration
that dropped one goes both ways, and those that change only the state write nothing."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from django_delayjobs.models import Job, JobEvent

pytestmark = pytest.mark.django_db(transaction=True)

OWN_INDEX = "the target_type foreign key's own index"


def indexes(model) -> dict[str, dict]:
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, model._meta.db_table)
    return {name: c for name, c in found.items() if c["index"] and not c["primary_key"]}


@pytest.mark.parametrize("model", [Job, JobEvent])
def test_no_plain_index_is_the_leading_part_of_another(model):
    every = indexes(model)
    for name, c in every.items():
        if c["unique"]:
            continue
        for other, o in every.items():
            assert other == name or o["columns"][: len(c["columns"])] != c["columns"], (
                f"{name} {c['columns']} is served by {other} {o['columns']}"
            )


def target_type_indexes() -> list[str]:
    return [name for name, c in indexes(Job).items() if c["columns"] == ["target_type_id"]]


def test_the_foreign_key_keeps_its_constraint_without_an_index_of_its_own():
    assert target_type_indexes() == [], OWN_INDEX
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, Job._meta.db_table)
    if connection.vendor == "postgresql":  # SQLite lists no named foreign keys
        assert any(c["foreign_key"] and c["columns"] == ["target_type_id"]
                   for c in found.values())  # fmt: skip
    assert found["delayjobs_target"]["columns"] == ["target_type_id", "target_id"]


def test_migration_0005_goes_back_and_forth():
    call_command("migrate", "django_delayjobs", "0004", verbosity=0)
    try:
        assert len(target_type_indexes()) == 1, OWN_INDEX
    finally:  # every app: going back also unapplied the test app's migrations that
        # depend on a later one of ours (a model with a foreign key to Job)
        call_command("migrate", verbosity=0)
    assert target_type_indexes() == []


@pytest.mark.parametrize(("name", "after"), [
    ("0006_time_ordered_job_ids", "0005_target_type_no_own_index"),  # ids' default: Django's
    ("0007_job_base_manager", "0006_time_ordered_job_ids"),  # a manager
])  # fmt: skip
def test_a_migration_of_the_state_alone_writes_nothing(name, after):
    """No SQL, so no table copy on SQLite."""
    executor = MigrationExecutor(connection)
    migration = executor.loader.get_migration("django_delayjobs", name)
    state = executor.loader.project_state(("django_delayjobs", after))
    with connection.schema_editor(collect_sql=True, atomic=False) as editor:
        migration.apply(state, editor, collect_sql=True)
    assert [sql for sql in editor.collected_sql if not sql.startswith("--")] == []
