# A hand-back that undid the claim of a job whose action never started records it as a
# ``handed_back`` event (see ``execution.unclaim``): a new choice, no SQL.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_delayjobs", "0008_event_order"),
    ]

    operations = [
        migrations.AlterField(
            model_name="jobevent",
            name="kind",
            field=models.CharField(
                choices=[
                    ("scheduled", "Scheduled"),
                    ("rescheduled", "Rescheduled"),
                    ("cancelled", "Cancelled"),
                    ("started", "Started"),
                    ("failed", "Failed"),
                    ("succeeded", "Succeeded"),
                    ("dead", "Dead"),
                    ("skipped", "Skipped"),
                    ("requeued", "Requeued"),
                    ("handed_back", "Handed Back"),
                ],
                max_length=16,
            ),
        ),
    ]
