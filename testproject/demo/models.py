"""The demo's one table: rows that tasks write, so a test can count database writes
(the fenced inbox: each ``demo.book`` task must leave exactly one)."""

from __future__ import annotations

from django.db import models


class Booking(models.Model):
    """One row per committed run of ``demo.book``: its label and the fence that wrote it."""

    id = models.BigAutoField(primary_key=True)
    label = models.CharField(max_length=200, db_index=True)
    fence = models.IntegerField()

    def __str__(self) -> str:
        return f"{self.label} (fence {self.fence})"
