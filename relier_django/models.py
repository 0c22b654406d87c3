"""relier_django's models: the DLQ admin's handle, and the two tables that make the
database a party to exactly-once (docs/transactions.md).

The DLQ lives in Redis, not in the database. Django's admin and permission system are
built around models, so (as django-rq does) one unmanaged model gives the DLQ admin a
place in the admin index and carries its two permissions; ``migrate`` records the model
and creates the permissions, never a table for it. ``OutboxEntry`` (pushes written in
the producer's transaction) and ``InboxEntry`` (a task's database work, recorded with
the work) are real tables, in every database a push waits for or a task writes to.
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


class OutboxEntry(models.Model):
    """A push written in its producer's database transaction (``RELIER["OUTBOX"]``).

    Inserted with the producer's rows, deleted once the task is stored in Redis and
    queued; a row that outlives ``OUTBOX_GRACE_S`` is sent by the relay (the scanner
    leader). One table per database: each alias a push waits for has its own.
    """

    # The task id is fixed at push: the relay and the on_commit send push the same
    # envelope under it, so whichever comes second is answered "already stored".
    task_id = models.CharField(max_length=64, primary_key=True)
    task = models.CharField(max_length=255)
    envelope = models.TextField()
    # Epoch ms (producer's clock): the push, and its absolute due and expiry times.
    created_ms = models.BigIntegerField(db_index=True)
    due_ms = models.BigIntegerField(null=True)
    expires_ms = models.BigIntegerField(null=True)

    class Meta:
        db_table = "relier_outbox"
        default_permissions = ()
        verbose_name = "outbox entry"
        verbose_name_plural = "outbox"

    def __str__(self) -> str:
        return f"{self.task}[{self.task_id}]"


class InboxEntry(models.Model):
    """The record that a task's database work committed (``@rl_task(atomic=True)``,
    ``relier_django.inbox.once``): written in the same transaction as that work, so
    the work is committed exactly when this row is. Its primary key makes the database
    itself refuse a second commit of the same work, whichever incarnation tries."""

    # "<task identity>:<part>" ("<identity>:" for a whole atomic task): one per unit of
    # work. The identity is "<task id>~<push token>" (Envelope.identity; "<task id>"
    # for a task pushed by a release without push tokens).
    key = models.CharField(max_length=200, primary_key=True)
    fence = models.BigIntegerField()
    result = models.TextField()  # the unit's result, JSON
    committed_ms = models.BigIntegerField(db_index=True)

    class Meta:
        db_table = "relier_inbox"
        default_permissions = ()
        verbose_name = "inbox entry"
        verbose_name_plural = "inbox"

    def __str__(self) -> str:
        return f"{self.key} (fence {self.fence})"
