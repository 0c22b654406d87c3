# The DLQ admin's model: unmanaged, so migrate creates its content type and its two
# permissions but no table (the entries live in Redis).

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="DeadLetter",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
            ],
            options={
                "verbose_name": "dead-letter queue",
                "verbose_name_plural": "dead-letter queue",
                "permissions": (
                    ("view_dlq", "Can view the dead-letter queue"),
                    ("manage_dlq", "Can release and delete dead-letter entries"),
                ),
                "managed": False,
                "default_permissions": (),
            },
        ),
    ]
