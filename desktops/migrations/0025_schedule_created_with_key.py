import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("desktops", "0024_alerts_commands_resolution_turn_start"),
    ]

    operations = [
        migrations.AddField(
            model_name="schedule",
            name="created_with_key",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="schedules",
                to="desktops.apikey",
            ),
        ),
        migrations.AddField(
            model_name="schedule",
            name="made_with_key",
            field=models.BooleanField(default=False),
        ),
    ]
