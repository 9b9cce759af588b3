import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("testapp", "0005_receipt"),
    ]

    operations = [
        migrations.CreateModel(
            name="LoudThing",
            fields=[
                ("thing_ptr", models.OneToOneField(
                    auto_created=True, on_delete=django.db.models.deletion.CASCADE,
                    parent_link=True, primary_key=True, serialize=False, to="testapp.thing",
                )),
                ("volume", models.IntegerField(default=0)),
            ],
            bases=("testapp.thing",),
        ),
    ]
