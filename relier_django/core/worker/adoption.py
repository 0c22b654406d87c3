"""Adoption: a plain Celery message for an ``@rl_task`` becomes a task of relier's.

``app.send_task("name", args, kwargs)`` by name (or any producer that is not relier's:
Celery's ``apply_async`` on a signature by name, another language's client) sends
Celery's own message: the arguments, and no envelope. The worker that receives it
*adopts* it: ``adopt.lua`` stores an envelope built from the message under the
message's Celery id (fence 1, state ``queued``), marked held by that worker and due
within one heartbeat TTL in the expiry index, in one step. From then on it is a task
like a pushed one: it starts through ``start.lua`` (fenced), a dead worker's adopted
task is resurrected, ``commit.lua`` commits it once, a failure lands in the DLQ.

Where: in the worker's main process as the message arrives (``task_received``), before
a pool process accepts it, which is when Celery acknowledges it without
``acks_late``; the main process then covers it like any reserved task
(``reservations``). The pool process adopts it again as it runs it (the same call,
answered "adopted before" with the stored envelope), so a message whose first
adoption failed (Redis unreachable at receipt) is adopted there, later: a worker
death between Celery's acknowledgement and that adoption loses it, as it would lose
a plain Celery task.

Duplicates (a broker redelivery, a second worker): the id is taken, nothing is stored
twice, and the stored envelope goes to ``start.lua``, which starts it only while it
waits; a finished task's outcome (kept ``RESULT_TTL_S``) or a DLQ entry under the id
makes a redelivery run nothing.

Which messages: one that carries no relier marker header and is not one envelope
argument (``reservations.fence_of``). A message that carries relier's header, or one
string that reads as an envelope, is still an envelope to verify: broken, it is
dead-lettered (``malformed_message``, ``payload_integrity``), never adopted.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..broker.marker import MARKER_HEADER
from ..model import resurrections
from ..model.config import Config
from ..model.envelope import Envelope
from ..model.spec import TaskSpec
from ..model.transition import history_tail
from ..store import scripts
from ..store.keys import KeySpace
from .reservations import fence_of


def is_plain(headers: Mapping[str, Any] | None, args: object, kwargs: object) -> bool:
    """Whether a message for an ``@rl_task`` is Celery's own (arguments, no envelope)
    rather than relier's: no marker header, and not one envelope-like argument."""
    if headers and MARKER_HEADER in headers:
        return False
    if kwargs:
        return True
    return fence_of(args) is None


@dataclass(frozen=True, slots=True)
class Adopted:
    """What ``adopt.lua`` answered: ``encoded`` is the stored envelope to run ('' when
    nothing may run: ``refusal`` says why)."""

    encoded: str
    new: bool = False
    refusal: str = ""  # 'dead-lettered' | 'finished'; '' when there is an envelope


def _parse(reply: list[Any]) -> Adopted:
    status = int(reply[0])
    if status == -2:
        return Adopted("", refusal="dead-lettered")
    if status == -4:
        return Adopted("", refusal="finished")
    return Adopted(str(reply[1]), new=status == 1)


def envelope_of(
    spec: TaskSpec, task_id: str, args: Sequence[Any], kwargs: Mapping[str, Any], queue: str
) -> Envelope:
    """The first incarnation of a plain message's task, as a push would have made it."""
    return Envelope(
        id=task_id, task=spec.name, args=tuple(args), kwargs=dict(kwargs), queue=queue,
        created_ms=int(time.time() * 1000), schema_version=spec.schema.version,
    )  # fmt: skip


def adopt(
    config: Config, spec: TaskSpec, env: Envelope, worker: str, token: str | None = None
) -> scripts.ScriptCall[Adopted]:
    """adopt.lua for one plain message's first incarnation (:func:`envelope_of`):
    store it as a task held by ``worker``, or answer the envelope stored by an earlier
    adoption. The call carries a fresh token (or ``token``), so running this same call
    again (a retry after a lost reply) is answered as the adoption it made (G10)."""
    limit = resurrections.stored(spec.max_resurrections, config.resurrection_policy())
    ttl_ms = int(config.heartbeat_ttl_s * 1000)
    tail = history_tail("adopted", fence=env.fence, worker=worker)
    argv: list[scripts.Arg] = [env.id, env.encode(config.signer), env.task, env.queue, worker,
                               ttl_ms, limit, tail, token or uuid.uuid4().hex]  # fmt: skip
    return scripts.ScriptCall(scripts.ADOPT, KeySpace.of(config).for_adopt(env.id), argv, _parse)
