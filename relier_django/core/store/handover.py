"""Hand-overs: how a workflow step's commit brings about tasks in other partitions.

On an unpartitioned store a step's commit creates its successor (a chain's next step,
its ``link=`` callbacks, a chord's callback once the header is complete) in the same
script (``commit.lua``), as a filing in the DLQ creates its ``link_error=`` errbacks
(``dead_letter.lua``): no moment has the step done and the successor missing (G1
across a workflow, G13). On a partitioned store the successor's keys live in the
partition of its own id, which Celery draws, and a Redis Cluster runs a script on one
slot. So the commit records a *hand-over* in the step's own partition, atomically with
the result: the successors' envelopes, under the step's id (the hand-over's token),
indexed by the commit time. Then:

1. the worker that committed completes it at once (:func:`complete`): each successor is
   stored in its partition by ``handover_store.lua`` (a chord member's result is counted
   in its chord's partition by ``chord_member.lua``, and the member that completes the
   header records the callback's own hand-over there), then ``handover_done.lua``
   forgets the record;
2. if that worker died first (or its calls failed), the scanner leader's sweep
   (:func:`sweep`) completes every record older than :data:`GRACE_MS`, in each
   partition, the same way.

Both may run, in any order and more than once: a successor is stored once (its marker,
``keys.handed``, names the token that stored it; an id that has a task or a result is
left alone), and forgetting twice is forgetting once. A successor stored is due now in
its partition's schedule index, so the scanner leader dispatches it, fenced, as any
scheduled task. What this costs against one script: two more round trips per step
after its commit, and a successor appears in its partition a moment after the commit
rather than with it (at most the grace plus a scanner pass if the worker died).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import chords, scripts
from .keys import KeySpace

logger = logging.getLogger(__name__)

# How old a record must be before the sweep completes it: the committing worker
# completes its own within a few milliseconds; a completion by both is harmless, so
# the grace only spares the sweep's work, not correctness.
GRACE_MS = 3_000
# Records the sweep reads per partition and pass.
SWEEP_BATCH = 100


@dataclass(frozen=True, slots=True)
class Handed:
    """One task a hand-over brings about: its id, envelope (fence 1, as stored), task
    name, queue and resurrection limit (an integer or a policy's text)."""

    id: str
    encoded: str
    task: str
    queue: str
    max_resurrections: int | str

    def as_json(self) -> list[Any]:
        return [self.id, self.encoded, self.task, self.queue, self.max_resurrections]


@dataclass(frozen=True, slots=True)
class Member:
    """A chord header member's commit, handed over to its chord's partition: the group
    id, the member's index and result (JSON), and the callback, created by the member
    that completes the header."""

    group: str
    index: int
    result: str
    callback: Handed


def record(tasks: Sequence[Handed], marker_ttl_ms: int, member: Member | None = None) -> str:
    """The hand-over record ``commit.lua`` stores: the tasks, how long each successor's
    marker is kept (at least its result's TTL, so that a late completion never stores a
    successor that already ran) and, for a chord's member, its place in the chord."""
    body: dict[str, Any] = {"ttl": marker_ttl_ms, "tasks": [t.as_json() for t in tasks]}
    if member is not None:
        body["chord"] = [member.group, member.index, member.result, member.callback.as_json()]
    return json.dumps(body)


def callback_token(group_id: str) -> str:
    """The token of the hand-over that creates a chord's callback, recorded in the
    chord's partition by the member that completes the header (``chord_member.lua``)."""
    return f"{group_id}:callback"


def _forget(part: KeySpace, token: str) -> scripts.ScriptCall[int]:
    return scripts.ScriptCall(scripts.HANDOVER_DONE, part.for_handover_done(), [token], int)


def _stores(keys: KeySpace, token: str, body: dict[str, Any]) -> list[scripts.ScriptCall[int]]:
    """The calls that store each successor of the hand-over ``token`` (its record's
    ``body``), each in its partition."""
    calls = []
    for task_id, encoded, name, queue, maxres in body["tasks"]:
        args: list[scripts.Arg] = [task_id, encoded, name, queue, maxres, token,
                                   int(body["ttl"]), keys.ledger_ms]  # fmt: skip
        calls.append(
            scripts.ScriptCall(scripts.HANDOVER_STORE, keys.for_handover_store(task_id), args, int)
        )
    return calls


def complete(
    client: Any, keys: KeySpace, token: str, stored: str, part: KeySpace | None = None
) -> int:
    """Store every successor of the hand-over ``token`` in its partition (a chord
    member's result in its chord's, and the callback once the header is complete), then
    forget the record, kept in ``part`` (default: the partition of the task id
    ``token``). Safe to call any number of times, concurrently too. Returns how many
    successors are stored by this hand-over (a replay counts them again)."""
    body = json.loads(stored)
    created = sum(call.run(client) for call in _stores(keys, token, body))
    if body.get("chord") is not None:
        created += _count_member(client, keys, token, body["chord"], int(body["ttl"]))
    _forget(part or keys.of_task(token), token).run(client)
    return created


def _count_member(client: Any, keys: KeySpace, token: str, member: list[Any], ttl: int) -> int:
    """A chord member's result counted in its chord's partition; the callback stored
    in its own by the hand-over of the member that completed the header (run by
    whoever completes this member's: the callback's is completed at most once more)."""
    group, index, result, callback = member
    args: list[scripts.Arg] = [token, index, result, chords.KEEP_MS,
                               record([Handed(*callback)], ttl), callback_token(group)]  # fmt: skip
    scripts.ScriptCall(scripts.CHORD_MEMBER, keys.for_chord_member(group), args, int).run(client)
    return complete_recorded(client, keys, keys.of_task(group), callback_token(group))


def complete_recorded(client: Any, keys: KeySpace, part: KeySpace, token: str) -> int:
    """:func:`complete` the hand-over ``token`` as ``part`` holds it (0: none there,
    it was completed already). For a caller that did not build the record itself."""
    stored = client.hget(part.handover_records, token)
    if stored is None:
        return 0
    return complete(client, keys, token, _text(stored), part)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def sweep(client: Any, keys: KeySpace, now_ms: int, grace_ms: int = GRACE_MS) -> int:
    """Complete the hand-overs recorded before ``now_ms - grace_ms`` (Redis clock) in
    every partition: those whose worker died, or failed, between its commit and its
    completion. Returns how many were completed."""
    done = 0
    parts = keys.parts()
    # One round trip for every partition's index: an idle leader's pass stays cheap.
    pipe = client.pipeline(transaction=False)
    for part in parts:
        pipe.zrangebyscore(part.handovers, "-inf", now_ms - grace_ms, start=0, num=SWEEP_BATCH)
    for part, tokens in zip(parts, pipe.execute(), strict=True):
        if not tokens:
            continue
        for token, stored in zip(tokens, client.hmget(part.handover_records, tokens), strict=True):
            token = _text(token)
            if stored is None:
                # Forgotten between the two reads (its worker completed it): only the
                # index entry, if any, is left to drop.
                _forget(part, token).run(client)
                continue
            try:
                complete(client, keys, token, _text(stored), part)
            except (ValueError, TypeError, KeyError):
                # Only a faulty writer makes one: kept for an operator, never blocking
                # the records after it.
                logger.error("unreadable hand-over record kept token=%s", token, exc_info=True)
                continue
            logger.info("hand-over completed by the sweep token=%s", token)
            done += 1
    return done
