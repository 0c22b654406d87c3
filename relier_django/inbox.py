"""The fenced inbox's public path: ``relier_django.inbox.once`` (docs/transactions.md).
The implementation lives with the rest of the database's side of exactly-once, in
``relier_django/db/inbox.py``."""

from .db.inbox import Unit, once

__all__ = ["Unit", "once"]
