"""Idempotency keys and the push-time claim (push.lua) and its undo (abort.lua)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..broker import publish
from ..model.envelope import Envelope
from ..model.limits import Gate
from ..model.timing import NOW, Timing
from ..store import scripts
from ..store.keys import KeySpace
from .admission import Limit
from .admission import script_args as admission_args


@dataclass(frozen=True, slots=True)
class StoreResult:
    stored: bool
    task_id: str  # the new task, or the one that holds the idempotency claim
    id_taken: bool = False  # a live task has this id
    id_finished: bool = False  # a finished task's outcome, still kept, has this id
    id_in_dlq: bool = False  # a DLQ entry has this id
    refused_for_s: float = 0.0  # > 0: admission control refused it; retry after this
    scheduled: bool = False  # stored to wait in the schedule index: publish nothing now
    parked: bool = False  # (scheduled too) parked over its limit by this call: tell it


def _parse_store(reply: list[Any]) -> StoreResult:
    code = int(reply[0])
    if code == -3:
        return StoreResult(False, "", refused_for_s=int(reply[1]) / 1000)
    task_id = str(reply[1])
    return StoreResult(
        code == 1, task_id, id_taken=code == -1, id_in_dlq=code == -2, id_finished=code == -4,
        scheduled=code == 1 and len(reply) > 2 and int(reply[2]) in (1, 2),
        parked=code == 1 and len(reply) > 2 and int(reply[2]) == 2,
    )  # fmt: skip


def store(
    keys: KeySpace,
    envelope: Envelope,
    encoded: str,
    queued_grace_ms: int,
    max_resurrections: int | str,
    admission: Sequence[Limit] = (),
    message: publish.Queued | None = None,
    *,
    token: str | None = None,
    when: Timing = NOW,
    gate: Gate | None = None,
    debounce: tuple[str, int] | None = None,
) -> scripts.ScriptCall[StoreResult]:
    """push.lua: admit (if limited), claim (if idempotent), store, mint fence 1; with
    ``message`` (the broker's list and the message for it), queue it in the same step.
    ``token`` names this push call (the same for every try of it; a fresh one when
    omitted): :func:`abort` with it undoes the store only if no other call was told
    "stored". ``when``: a countdown or eta stores the task to wait in the schedule
    index (``StoreResult.scheduled``; nothing is queued), and an expiry with it.
    ``gate``: the push's flow control (model/limits.py): the task is stored scheduled,
    due at once (or at its countdown), for the leader's dispatch to reserve its rate
    and its slot or park it. ``debounce``: a debounced push's record key
    (``KeySpace.debounce``) and RESULT_TTL_S in ms: the task the record names, if it
    has not been dispatched yet, is superseded by this one in the same step."""
    idem = keys.idempotency(envelope.task, envelope.idem_key) if envelope.idem_key else None
    queued, payload = (message.keys, message.payload) if message is not None else (None, "")
    return scripts.ScriptCall(
        scripts.PUSH,
        keys.for_push(envelope.id, idem, [limit.key for limit in admission], queued,
                      debounce[0] if debounce else None),
        [envelope.id, encoded, envelope.task, envelope.queue, queued_grace_ms, max_resurrections,
         *admission_args(admission), payload, token or uuid.uuid4().hex,
         *when.script_args(), gate.script_arg() if gate is not None else "",
         debounce[1] if debounce else "", keys.ledger_ms],
        _parse_store,
    )  # fmt: skip


def abort(keys: KeySpace, envelope: Envelope, token: str) -> scripts.ScriptCall[bool]:
    """abort.lua: undo the push ``token`` made, whose send failed, if nothing has moved
    since and no other push of the same envelope counts on it. True: nothing of it is
    left in the store."""
    idem = keys.idempotency(envelope.task, envelope.idem_key) if envelope.idem_key else None
    return scripts.ScriptCall(
        scripts.ABORT,
        keys.for_abort(envelope.id, idem),
        [envelope.id, token],
        lambda r: bool(int(r)),
    )
