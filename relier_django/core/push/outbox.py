"""The relay's send of a committed outbox row: the push a producer's commit kept.

The row holds the push's envelope (its task id fixed at push) and its absolute due and
expiry times. Sending it runs ``push.lua`` with that envelope, so the relay and the
commit's own callback can race, and a relay can re-send a row whose delete was lost:
whichever comes second is answered "already stored" (the same envelope), "already
moved on" (the task hash holds a later incarnation), "finished" or "in the DLQ", and
none of those stores or runs anything twice. The Django side (``relier_django.outbox``)
reads and deletes the rows; this module never touches a database.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..model import config
from ..model.envelope import decode
from ..model.errors import DuplicateTaskId
from ..model.spec import TaskSpec
from ..model.timing import Timing
from ..store.connection import sync_client
from ..store.keys import KeySpace
from .producer import _Push, _record_of, gate_for

logger = logging.getLogger("relier_django.outbox")


class Sent(StrEnum):
    """What a relay send found; every one of them lets the row go."""

    STORED = "stored"  # stored (or already stored under this envelope) and queued
    DEDUPLICATED = "deduplicated"  # an idempotent duplicate: another push holds the key
    ALREADY = "already"  # sent before: moved on, finished or in the DLQ


@dataclass(frozen=True, slots=True)
class Row:
    """A committed outbox row, as the relay reads it."""

    task_id: str
    envelope: str
    due_ms: int | None = None
    expires_ms: int | None = None


def send(app: Any, row: Row) -> Sent:
    """Store and queue a committed outbox row's push (no database access here).

    Raises:
        LookupError: its task is not an ``@rl_task`` of ``app`` (the row stays, for a
            process that knows the task).
        EnvelopeError: the envelope does not verify (a signing key removed too early).
        AdmissionRejected, Redis or broker errors: not sent; the row stays.
    """
    cfg = config.current()
    env = decode(row.envelope, cfg.signer)
    spec = getattr(app.tasks.get(env.task), "relier_spec", None)
    if not isinstance(spec, TaskSpec):
        raise LookupError(f"{env.task} is not an @rl_task registered on this Celery app")
    # A fresh push token: this is another call than the commit's own, so that an
    # undo of this call (a failed publish) never undoes what that one stored.
    when = Timing(eta_ms=row.due_ms, expires_at_ms=row.expires_ms)
    keys = KeySpace.of(cfg)
    p = _Push(cfg, spec, env, row.envelope, keys, when=when, record=_record_of(env, None),
              gate=gate_for(cfg, spec, env, keys))  # fmt: skip
    try:
        receipt = p.send_now(app, sync_client(cfg, fail_fast=True))
    except DuplicateTaskId:
        return Sent.ALREADY
    return Sent.DEDUPLICATED if receipt.deduplicated else Sent.STORED
