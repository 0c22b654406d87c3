"""What is scheduled, as the Django layer sees it: the core's read-only listing
(``core.schedule.listing``) wired to settings and the project's Celery app.

``manage.py relier_scheduled`` and the admin's "Scheduled tasks" and "Periodic
entries" pages both read through here, so they show the same thing and hold no logic
of their own (docs/scheduling.md, "Seeing what is scheduled").
"""

from __future__ import annotations

from celery import current_app

from .. import conf
from ..core.schedule.listing import (
    MAX_PAGE,
    Cursor,
    NotFired,
    Page,
    Periodic,
    PeriodicEntry,
    Scheduled,
    iso,
)
from ..core.schedule.listing import page as _page
from ..core.schedule.listing import periodic as _periodic

__all__ = [
    "MAX_PAGE",
    "Cursor",
    "NotFired",
    "Page",
    "Periodic",
    "PeriodicEntry",
    "Scheduled",
    "iso",
    "page",
    "periodic",
]


def page(cursor: Cursor | None = None, limit: int = 50, task: str | None = None) -> Page:
    """A page of the configured store's schedule, earliest due first; see
    ``core.schedule.listing.page``."""
    return _page(conf.get_config(), cursor, limit, task)


def periodic() -> Periodic:
    """The project's periodic entries with their last and next ticks; see
    ``core.schedule.listing.periodic``."""
    return _periodic(current_app._get_current_object(), conf.get_config())
