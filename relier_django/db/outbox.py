"""The transactional outbox: a push inside ``atomic()`` is written into the producer's
own transaction, so its commit keeps the task even if the process dies before the
send (``RELIER["OUTBOX"] = True``; docs/transactions.md).

- ``hold`` (the core's ``OutboxHook``) writes the row, on the database whose
  transaction the push waits for; the commit's callback deletes it once sent.
- ``relay`` (a duty of the scanner leader, in every worker and ``relier_resurrector``)
  sends every row older than ``OUTBOX_GRACE_S`` in every database that has the table,
  and prunes the fenced inbox's old rows (``relier_django.inbox``).
- ``backlog`` counts the rows waiting, per database, for the metrics and the admin.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, close_old_connections, connections, router
from kombu.exceptions import OperationalError as BrokerError
from redis.exceptions import RedisError

from .. import conf
from ..core.model.envelope import Envelope
from ..core.model.timing import Timing
from ..core.push import outbox as core_outbox
from ..core.push import producer
from ..models import InboxEntry, OutboxEntry

logger = logging.getLogger("relier_django.outbox")

BATCH = 500  # rows sent per database per pass: a backlog drains over passes
_PRUNE_EVERY_S = 60.0
_LOOKUP_EVERY_S = 60.0


class OutboxUnavailable(RuntimeError):
    """The outbox row of a push could not be written (its table is missing: run
    ``manage.py migrate``). Raised inside the transaction, which then rolls back."""


def hold(using: str | None, env: Envelope, encoded: str, when: Timing) -> Callable[[], None] | None:
    """The core's ``OutboxHook``: write the push into the outbox of the transaction open
    on ``using``; returns the row's delete, or None when ``OUTBOX`` is off.

    The due and expiry times are stored absolute (from the push's own clock), so a
    row the relay sends an hour later is still due when it was meant to be.
    """
    if not conf.get_django_settings().outbox:
        return None
    alias = using or DEFAULT_DB_ALIAS
    created = env.created_ms
    due = when.eta_ms if when.eta_ms is not None else _after(created, when.countdown_ms)
    expires = when.expires_at_ms
    if expires is None:
        expires = _after(created, when.expires_in_ms)
    try:
        OutboxEntry.objects.using(alias).create(
            task_id=env.id, task=env.task, envelope=encoded, created_ms=created,
            due_ms=due, expires_ms=expires,
        )  # fmt: skip
    except DatabaseError as exc:
        raise OutboxUnavailable(
            f"RELIER['OUTBOX'] is on, but the push of {env.task} could not be written to "
            f"the outbox of database {alias!r} ({type(exc).__name__}: {exc}); run "
            f"`manage.py migrate relier_django --database {alias}`"
        ) from exc
    return functools.partial(_delete, alias, env.id)


def _after(start_ms: int, delta_ms: int | None) -> int | None:
    return None if delta_ms is None else start_ms + delta_ms


def _delete(alias: str, task_id: str) -> None:
    OutboxEntry.objects.using(alias).filter(task_id=task_id).delete()


def databases(unreadable: set[str] | None = None) -> list[str]:
    """The aliases whose database holds the outbox table (migrated, and allowed there
    by the routers). A database that cannot be read is skipped, and added to
    ``unreadable`` (logged only when it was not there already)."""
    found = []
    for alias in connections:
        if not router.allow_migrate_model(alias, OutboxEntry):
            continue
        try:
            tables = connections[alias].introspection.table_names()
        except DatabaseError as exc:
            if unreadable is None or alias not in unreadable:
                logger.warning("outbox: database %r cannot be read: %s", alias, exc)
            if unreadable is not None:
                unreadable.add(alias)
            continue
        if unreadable is not None:
            unreadable.discard(alias)
        if OutboxEntry._meta.db_table in tables:
            found.append(alias)
    return found


def backlog() -> dict[str, int]:
    """Rows waiting to be sent, per database that has the outbox table."""
    return {alias: backlog_of(alias) for alias in databases()}


def backlog_of(alias: str) -> int:
    """Rows waiting to be sent in the outbox of ``alias``."""
    return int(OutboxEntry.objects.using(alias).count())


@dataclass
class RelayReport:
    """One relay pass: rows sent, found sent before, and left (per failure)."""

    sent: int = 0
    already: int = 0
    left: dict[str, int] = field(default_factory=dict)


@dataclass
class Relay:
    """Sends committed outbox rows older than the grace; run by the scanner leader."""

    app: Any
    _pruned_at: float = -_PRUNE_EVERY_S  # the first pass prunes
    # The databases with the table, looked up again every _LOOKUP_EVERY_S (a migrate
    # while workers run is seen within that); those that could not be read.
    _aliases: list[str] = field(default_factory=list)
    _looked_up_at: float = -_LOOKUP_EVERY_S
    _unreadable: set[str] = field(default_factory=set)

    def __call__(self) -> RelayReport:
        close_old_connections()  # a long-lived thread: drop connections a restart broke
        try:
            if time.monotonic() - self._looked_up_at >= _LOOKUP_EVERY_S:
                self._looked_up_at = time.monotonic()
                self._aliases = databases(self._unreadable)
            report = RelayReport()
            for alias in self._aliases:
                try:
                    self._relay(alias, report)
                except DatabaseError as exc:  # that database only; the others go on
                    report.left["DatabaseError"] = report.left.get("DatabaseError", 0) + 1
                    logger.warning("outbox: database %r cannot be relayed: %s", alias, exc)
            if time.monotonic() - self._pruned_at > _PRUNE_EVERY_S:
                self._pruned_at = time.monotonic()
                for alias in self._aliases:
                    _prune_inbox(alias)
            if report.sent or report.already or report.left:
                # WARNING: each row here is a push its own commit did not send.
                logger.warning(
                    "outbox relay sent=%s already=%s left=%s",
                    report.sent, report.already, report.left,
                )  # fmt: skip
            return report
        finally:
            close_old_connections()

    def _relay(self, alias: str, report: RelayReport) -> None:
        grace_ms = int(conf.get_django_settings().outbox_grace_s * 1000)
        older_than = int(time.time() * 1000) - grace_ms
        rows = list(
            OutboxEntry.objects.using(alias)
            .filter(created_ms__lt=older_than)
            .order_by("created_ms")[:BATCH]
        )
        for row in rows:
            try:
                sent = core_outbox.send(
                    self.app,
                    core_outbox.Row(row.task_id, row.envelope, row.due_ms, row.expires_ms),
                )
            except Exception as exc:
                why = type(exc).__name__
                report.left[why] = report.left.get(why, 0) + 1
                logger.warning(
                    "outbox row not sent, left for the next pass database=%s task=%s "
                    "task_id=%s reason=%s: %s",
                    alias, row.task, row.task_id, why, exc,
                )  # fmt: skip
                if isinstance(exc, RedisError | OSError | BrokerError):
                    return  # Redis or the broker is down: the next rows would fail alike
                continue
            if sent is core_outbox.Sent.ALREADY:
                report.already += 1
                # Usually a commit's send whose delete was lost; the envelope is logged
                # in case it was a caller-chosen id that another task already took.
                logger.warning(
                    "outbox row was sent before (or its id is taken): dropped database=%s "
                    "task=%s task_id=%s envelope=%s",
                    alias, row.task, row.task_id, row.envelope,
                )  # fmt: skip
            else:
                report.sent += 1
                logger.info(
                    "outbox relay sent a push its commit did not database=%s task=%s task_id=%s",
                    alias, row.task, row.task_id,
                )  # fmt: skip
            _delete(alias, row.task_id)


def _prune_inbox(alias: str) -> None:
    if InboxEntry._meta.db_table not in connections[alias].introspection.table_names():
        return
    keep_ms = int(conf.get_django_settings().inbox_keep_s * 1000)
    before = int(time.time() * 1000) - keep_ms
    pruned, _ = InboxEntry.objects.using(alias).filter(committed_ms__lt=before).delete()
    if pruned:
        logger.info("inbox: pruned %s row(s) older than INBOX_KEEP_S database=%s", pruned, alias)


def install() -> None:
    """Called from ``AppConfig.ready()``: pushes inside ``atomic()`` consult the outbox
    (which writes nothing while ``OUTBOX`` is off)."""
    producer.set_outbox_hook(hold)
