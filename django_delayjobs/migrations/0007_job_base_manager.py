# Job's base manager reads where Job is written (models.OnWriteDatabase): state only, no SQL.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("django_delayjobs", "0006_time_ordered_job_ids"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="job",
            options={"base_manager_name": "objects", "ordering": ["-run_at"]},
        ),
    ]
