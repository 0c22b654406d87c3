"""The public path of ``replay()``, for a push whose send failed after its transaction
committed (docs/transactions.md). The on-commit hook itself lives in
``relier_django/db/transactions.py``."""

from .db.transactions import replay

__all__ = ["replay"]
