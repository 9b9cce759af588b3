# A job's events are ordered by id, the order their changes were committed in (not by
# their writers' clocks): state only, no SQL.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("django_delayjobs", "0007_job_base_manager"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="jobevent",
            options={"ordering": ["id"]},
        ),
    ]
