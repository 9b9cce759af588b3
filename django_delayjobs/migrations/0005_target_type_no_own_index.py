"""Drop the index Django gave the ``target_type`` foreign key: the ``delayjobs_target``
index on (target_type, target_id) serves every lookup it served, and each index costs
every insert and every status change of a job.

Only that index is dropped. A plain ``AlterField`` would also drop and re-add the
foreign key constraint on PostgreSQL (re-checking every row while writes wait) and copy
the whole table on SQLite.
"""

from django.db import migrations, models


def own_indexes(schema_editor, model):
    """The names of plain indexes on ``target_type_id`` alone."""
    column = model._meta.get_field("target_type").column
    with schema_editor.connection.cursor() as cursor:
        constraints = schema_editor.connection.introspection.get_constraints(
            cursor, model._meta.db_table
        )
    return [
        name
        for name, c in constraints.items()
        if c["index"] and c["columns"] == [column]
        and not (c["unique"] or c["primary_key"] or c["foreign_key"])
    ]  # fmt: skip


def drop(apps, schema_editor):
    job = apps.get_model("django_delayjobs", "Job")
    for name in own_indexes(schema_editor, job):
        schema_editor.execute(schema_editor._delete_index_sql(job, name))


def restore(apps, schema_editor):
    job = apps.get_model("django_delayjobs", "Job")
    if not own_indexes(schema_editor, job):
        field = job._meta.get_field("target_type")
        schema_editor.execute(schema_editor._create_index_sql(job, fields=[field]))


class Migration(migrations.Migration):
    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("django_delayjobs", "0004_finished_at_index"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="job",
                    name="target_type",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=models.deletion.PROTECT,
                        related_name="+",
                        to="contenttypes.contenttype",
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(drop, restore)],
        ),
    ]
