"""The DLQ as the Django layer sees it: the store and release, wired to settings.

``manage.py relier_dlq`` and the admin pages both go through here, so they read the
same settings and the same Celery app, and hold no logic of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import current_app

from . import conf
from .core.dlq.entries import Entry, Summary, iso
from .core.dlq.release import BulkRelease, release, release_matching
from .core.dlq.store import MAX_PAGE, Counts, Cursor, DeadLetterStore, Page, Query
from .core.model.errors import EntryNotReleasable
from .core.model.failure import Reason
from .core.observe.task import TaskView
from .core.store.connection import sync_client
from .core.store.keys import KeySpace
from .core.store.receipt import Receipt

__all__ = [
    "MAX_PAGE",
    "BulkRelease",
    "Counts",
    "Cursor",
    "DeadLetterStore",
    "Entry",
    "EntryNotReleasable",
    "Page",
    "Query",
    "Reason",
    "Summary",
    "TaskView",
    "iso",
    "release_entry",
    "release_where",
    "store",
]


def store() -> DeadLetterStore:
    """The DLQ of the configured Redis and key prefix."""
    cfg = conf.get_config()
    return DeadLetterStore(sync_client(cfg), KeySpace.of(cfg), cfg.checkpoint_dir)


def _app() -> Any:
    # The project's Celery app (made current by the usual `from .celery import app`).
    return current_app._get_current_object()


def release_entry(entry_id: str, expected_fence: int | None = None) -> Receipt:
    """Release one entry; see ``core.release.release`` for what is guaranteed."""
    return release(_app(), conf.get_config(), entry_id, expected_fence)


def release_where(
    query: Query, *, dry_run: bool = False, on_release: Callable[[str], None] | None = None
) -> BulkRelease:
    """Release every entry matching ``query``; see ``core.release.release_matching``.

    ``on_release(entry_id)`` is called after each release, so a caller can report
    progress even if a broker error stops the run part-way.
    """
    return release_matching(
        _app(), conf.get_config(), query, dry_run=dry_run, on_release=on_release
    )
