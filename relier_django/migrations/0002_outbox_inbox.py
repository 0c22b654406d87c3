# The transactional outbox (pushes written with the producer's rows) and the fenced
# inbox (a task's database work recorded with the work itself): docs/transactions.md.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("relier_django", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="OutboxEntry",
            fields=[
                ("task_id", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("task", models.CharField(max_length=255)),
                ("envelope", models.TextField()),
                ("created_ms", models.BigIntegerField(db_index=True)),
                ("due_ms", models.BigIntegerField(null=True)),
                ("expires_ms", models.BigIntegerField(null=True)),
            ],
            options={
                "db_table": "relier_outbox",
                "default_permissions": (),
                "verbose_name": "outbox entry",
                "verbose_name_plural": "outbox",
            },
        ),
        migrations.CreateModel(
            name="InboxEntry",
            fields=[
                ("key", models.CharField(max_length=200, primary_key=True, serialize=False)),
                ("fence", models.BigIntegerField()),
                ("result", models.TextField()),
                ("committed_ms", models.BigIntegerField(db_index=True)),
            ],
            options={
                "db_table": "relier_inbox",
                "default_permissions": (),
                "verbose_name": "inbox entry",
                "verbose_name_plural": "inbox",
            },
        ),
    ]
