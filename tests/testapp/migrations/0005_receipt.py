import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_delayjobs", "0007_job_base_manager"),
        ("testapp", "0004_ticket"),
    ]

    operations = [
        migrations.CreateModel(
            name="Receipt",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name="ID")),
                ("job", models.ForeignKey(on_delete=django.db.models.deletion.PROTECT,
                                          to="django_delayjobs.job")),
            ],
        ),
    ]
