"""The admin's handle on the dead-letter queue: a model with no table.

The DLQ lives in Redis, not in the database. Django's admin and permission system are
built around models, so (as django-rq does) one unmanaged model gives the DLQ admin a
place in the admin index and carries its two permissions; ``migrate`` records the model
and creates the permissions, never a table.
"""

from __future__ import annotations

from django.db import models

VIEW_PERMISSION = "relier_django.view_dlq"
MANAGE_PERMISSION = "relier_django.manage_dlq"


class DeadLetter(models.Model):
    """Never queried: there is no table. Exists for the admin and the permissions."""

    # Declared, not auto-created, so the migration does not depend on the project's
    # DEFAULT_AUTO_FIELD (models.W042) and never changes under a project that differs.
    id = models.BigAutoField(primary_key=True)

    class Meta:
        managed = False
        # Only the two below: the admin's add/change/delete/view would mean nothing here.
        default_permissions = ()
        permissions = (
            ("view_dlq", "Can view the dead-letter queue"),
            ("manage_dlq", "Can release and delete dead-letter entries"),
        )
        verbose_name = "dead-letter queue"
        verbose_name_plural = "dead-letter queue"

    def __str__(self) -> str:
        return "dead-letter queue"
