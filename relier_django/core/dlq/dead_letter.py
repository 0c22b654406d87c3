"""Dead-lettering: the write (``dead_letter.lua``) that moves a task, or a message tied
to no task, into the DLQ with its reason, history and checkpoint.

Reading an entry back is ``entries``; paging, counting and deleting are ``store``;
release is ``release``.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..model import events, outcome, workflow
from ..model.config import Config
from ..model.envelope import Envelope
from ..model.failure import Failure, entry_json
from ..model.signing import Signer
from ..model.transition import Transition, history_tail, parse_transition
from ..store import handover, scripts
from ..store.keys import KeySpace

logger = logging.getLogger(__name__)


def _message_entry_id(raw: object) -> str:
    # The same body gets the same entry: a message delivered twice is filed once.
    text = raw if isinstance(raw, str) else repr(raw)
    return "msg-" + hashlib.sha256(text.encode()).hexdigest()[:32]


def _told(event: events.TaskDeadLettered) -> Callable[[list[Any]], Transition]:
    """The reply's parser, which also emits ``event`` once the script filed it: every
    filing (runner, scanner, dispatcher) passes through here after its one reply."""

    def parse(reply: list[Any]) -> Transition:
        moved = parse_transition(reply)
        if moved.accepted:
            events.emit(event)
        return moved

    return parse


@dataclass(frozen=True, slots=True)
class StoredTask:
    """A stored task as its hash describes it, for when its envelope cannot be read."""

    task_id: str
    fence: int
    task: str
    queue: str
    idem_key: str | None  # the full idempotency key, as push.lua stored it


def dead_letter(
    keys: KeySpace,
    failure: Failure,
    result_ttl_ms: int,
    *,
    env: Envelope | None,
    raw: object = None,
    queue: str = "",
    task: str = "",
    signer: Signer | None = None,
    stored: StoredTask | None = None,
    held: str = "running",
    now_ms: int | None = None,
) -> scripts.ScriptCall[Transition]:
    """dead_letter.lua. With ``env`` the move is fenced to that incarnation and the
    task's working keys go with it; without, only the entry is written: a message
    that cannot be tied to a stored task keeps its raw body, with the ``queue`` it
    arrived on and the ``task`` it was addressed to, when known. Pass the config's
    ``signer`` when signing is on, or the entry cannot be released.

    ``stored``: a stored task whose own envelope cannot be read (a copy edited in
    Redis, a key removed too early), described by its task hash: the move is fenced
    to it, its working keys and idempotency claim go, as with ``env``, and the entry
    keeps the ``raw`` text.

    ``held``: the state the caller holds the task in (``running``, ``queued`` for a
    message refused before it started, ``dying`` for the scanner's lease); a task in
    any other state is left alone, so a second copy of a message cannot take a task
    from the copy that runs it. A message tied to no task is filed under an id
    derived from its body: a second copy of it finds its entry and adds nothing.

    ``env``'s errbacks (``link_error=``) are created by the same script, dated
    ``now_ms`` (epoch ms; default: this process's clock).
    """
    idem: str | None = None
    if env is not None:
        entry_id = task_id = env.id
        fence = str(env.fence)
        idem = keys.idempotency(env.task, env.idem_key) if env.idem_key else None
    elif stored is not None:
        entry_id = task_id = stored.task_id
        fence = str(stored.fence)
        task, queue, idem = stored.task, stored.queue, stored.idem_key
    else:
        entry_id = task_id = _message_entry_id(raw)
        fence = ""
        held = ""
    told = events.TaskDeadLettered(
        task_id, env.task if env is not None else task, int(fence) if fence else None,
        str(failure.reason), failure.summary, env.queue if env is not None else queue,
        entry_id,
    )  # fmt: skip
    tail = history_tail(
        "dead",
        fence=env.fence if env else None,
        reason=str(failure.reason),
        error=failure.error,
        worker=failure.worker,
    )
    errbacks = _errbacks(env, signer, now_ms) if env is not None else []
    tail_args: list[scripts.Arg] = []
    if errbacks and keys.tagged and env is not None:
        # A partitioned store: the errbacks live in other partitions (store/handover.py).
        handed = [_handed(eb) for eb in errbacks]
        script_keys = keys.for_dead_letter_handing_over(task_id, idem)
        tail_args = [0, handover.record(handed, result_ttl_ms), errback_token(env)]
    else:
        ids = [str(eb[0]) for eb in errbacks]
        script_keys = keys.for_dead_letter(task_id, entry_id, idem, ids)
        if errbacks:
            tail_args = [len(errbacks), *(arg for eb in errbacks for arg in eb)]
    return scripts.ScriptCall(
        scripts.DEAD_LETTER,
        script_keys,
        [
            task_id,
            fence,
            entry_id,
            entry_json(task_id, entry_id, failure, env, raw, signer),
            outcome.failed(str(failure.reason), failure.error, entry_id),
            result_ttl_ms,
            tail,
            env.task if env is not None else task,
            str(failure.reason),
            env.queue if env is not None else queue,
            failure.summary,
            held,
            uuid.uuid4().hex,
            str(env.chord.get("id", "")) if env is not None and env.chord else "",
            *tail_args,
        ],
        _told(told),
    )


def _handed(errback: list[scripts.Arg]) -> handover.Handed:
    # An errback as _errbacks gives it, as a hand-over names it (errbacks are ungated).
    task_id, encoded, task, queue, limit, _gate = errback
    return handover.Handed(str(task_id), str(encoded), str(task), str(queue),
                           limit if isinstance(limit, int) else str(limit))  # fmt: skip


def errback_token(env: Envelope) -> str:
    """The token of the hand-over that brings about ``env``'s errbacks on a partitioned
    store: one per filing (a released task filed again records a new one), held in the
    partition of ``env.id``."""
    return f"{env.id}:dead:{env.fence}"


def _errbacks(env: Envelope, signer: Signer | None, now_ms: int | None) -> list[list[scripts.Arg]]:
    """The errbacks (``link_error=``) the filing of ``env`` creates, as dead_letter.lua
    takes them: id, envelope, task, queue, resurrection limit, gate (errbacks are
    ungated: a push refuses one whose task has flow control). The push resolved each
    one's resurrection limit; an envelope without one gets the default's."""
    try:
        found = workflow.errbacks(env, int(time.time() * 1000) if now_ms is None else now_ms)
    except ValueError:
        # Only a faulty producer writes one (the checksum held); the filing goes on.
        logger.warning("errbacks unreadable, none created task_id=%s", env.id, exc_info=True)
        return []
    return [
        [eb.id, eb.encode(signer), eb.task, eb.queue,
         Config().max_resurrections if limit is None else limit, ""]
        for eb, limit in found
    ]  # fmt: skip
