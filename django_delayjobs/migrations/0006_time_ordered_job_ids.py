# New job ids are UUIDs of version 7 (time-ordered). The default is applied by Django,
# not by the database, so only the migration state changes: an AlterField would make
# SQLite copy the whole job table to change nothing.

from django.db import migrations, models

import django_delayjobs.models


class Migration(migrations.Migration):

    dependencies = [
        ("django_delayjobs", "0005_target_type_no_own_index"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="job",
                    name="id",
                    field=models.UUIDField(
                        default=django_delayjobs.models.time_ordered_uuid,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
            ],
        ),
    ]
