"""The cluster's figures for Django: read once (``read``), shown three ways.

- Prometheus text (``exposition``, written by ``prometheus``), served by
  ``relier_django.urls`` at ``metrics``.
- ``manage.py relier_status`` (plain text, ``--watch``, ``--json``).
- The admin's Relier overview page, whose listed tasks link to a page each (``task``,
  and ``outcome`` once a task is no longer in flight).

Every figure comes from relier's Redis (``core/observe``), so any one web process
serves the whole cluster's numbers, the same as every other. The metric names
(``prometheus``) are a public contract: docs/observability.md lists each with its
meaning.
"""

from __future__ import annotations

import logging

from celery import current_app

from .. import conf
from ..core.broker.depth import queue_depth
from ..core.observe import live, measurements
from ..core.observe.measurements import Figures
from ..core.store.connection import sync_client
from ..readers import limits

logger = logging.getLogger("relier_django.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def read(task_limit: int = live.TASK_LIST_LIMIT) -> Figures:
    """Every figure, from relier's Redis and (the recovery queue's depth) the broker."""
    cfg = conf.get_config()
    app = current_app._get_current_object()
    return measurements.read(
        sync_client(cfg),
        cfg,
        broker_depth=lambda: queue_depth(app, cfg.recovery_queue),
        task_limit=task_limit,
        limit_rates=limits.task_rates(),
    )


def outbox_backlog() -> dict[str, int | None]:
    """Outbox rows waiting for the relay, per database that has the outbox table
    (``None`` for one that cannot be read just now: never an error of the page)."""
    from ..db import outbox  # the models: only once the app registry is ready

    backlog: dict[str, int | None] = {}
    try:
        aliases = outbox.databases()
    except Exception:
        logger.warning("metrics: the databases cannot be listed", exc_info=True)
        return backlog
    for alias in aliases:
        try:
            backlog[alias] = outbox.backlog_of(alias)
        except Exception:
            logger.warning("metrics: the outbox of %r cannot be read", alias, exc_info=True)
            backlog[alias] = None
    return backlog


def exposition(found: Figures, outbox: dict[str, int | None] | None = None) -> bytes:
    """The Prometheus text format of one reading (and of ``outbox_backlog()``'s)."""
    from .prometheus import text  # prometheus_client only where the text is served

    return text(found, outbox or {})
