"""Fence-checked transitions of one incarnation: start, heartbeat, commit, retry.

Each is one Lua script; each refuses to act unless the caller holds the task's
current fence (G2).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..broker import publish
from ..model.envelope import Envelope
from ..model.transition import Transition, history_tail, parse_transition
from ..store import chords, scripts
from ..store.keys import KeySpace


@dataclass(frozen=True, slots=True)
class StartResult:
    started: bool
    refusal: str = ""  # 'gone' | 'stale' | 'started' | 'expired'; '' when started
    current_fence: int = -1
    checkpoint: str = ""  # the task's latest checkpoint record, '' if none
    due_ms: int | None = None  # when it was due (countdown, eta, periodic tick), epoch ms


def _parse_start(reply: list[Any]) -> StartResult:
    checkpoint = str(reply[3]) if len(reply) > 3 else ""
    due = int(reply[4]) if len(reply) > 4 and reply[4] != "" else None
    return StartResult(int(reply[0]) == 1, str(reply[1]), int(reply[2]), checkpoint, due)


def start(
    keys: KeySpace, env: Envelope, worker: str, ttl_ms: int
) -> scripts.ScriptCall[StartResult]:
    """start.lua: claim this incarnation's one start. The call carries a fresh run
    token, so running this same call again (a retry after a lost reply) is answered
    as the start it made, while any other delivery of the incarnation is refused."""
    tail = history_tail("start", fence=env.fence, attempt=env.attempt, worker=worker)
    return scripts.ScriptCall(
        scripts.START,
        keys.for_start(env.id),
        [env.id, env.fence, worker, ttl_ms, tail, uuid.uuid4().hex],
        _parse_start,
    )


def heartbeat(
    keys: KeySpace,
    held: Sequence[tuple[str, int]],
    ttl_ms: int,
    state: str = "running",
    worker: str = "",
) -> scripts.Call[list[str]]:
    """Refresh all ``(task_id, fence)`` pairs at once (one call per partition); returns
    the ids that were lost.

    ``state`` is what the holder expects: ``running`` (a pool process's tasks) or
    ``queued`` (a worker's reserved, not yet started messages, which the script marks
    as held by ``worker``)."""

    def build(part: KeySpace, chunk: list[tuple[str, int]]) -> scripts.ScriptCall[list[str]]:
        ids = [task_id for task_id, _ in chunk]
        args: list[scripts.Arg] = [ttl_ms, state]
        for task_id, fence in chunk:
            args += [task_id, fence]
        args.append(worker)

        def parse(reply: list[Any]) -> list[str]:
            return [ids[int(i) - 1] for i in reply]

        return scripts.ScriptCall(scripts.HEARTBEAT, part.for_heartbeat(ids), args, parse)

    return scripts.per_partition(keys, held, _first, build, _concat)


def handoff(
    keys: KeySpace, held: Sequence[tuple[str, int]], state: str, cause: str, death: str = ""
) -> scripts.Call[int]:
    """Give ``(task_id, fence)`` pairs up for immediate resurrection. ``cause`` is
    ``drain`` (a stopping worker) or ``pool_death`` (the pool process died), counted
    as the resurrection's cause; ``death`` says how a pool process died when its main
    process knows (``signal:SIGKILL``, ``exit:3``, ``oom``)."""

    def build(part: KeySpace, chunk: list[tuple[str, int]]) -> scripts.ScriptCall[int]:
        args: list[scripts.Arg] = [state]
        for task_id, fence in chunk:
            args += [task_id, fence]
        args.append(cause)
        if death:
            args.append(death)
        ids = [task_id for task_id, _ in chunk]
        keys = part.for_handoff(ids, histories=bool(death))
        return scripts.ScriptCall(scripts.HANDOFF, keys, args, int)

    return scripts.per_partition(keys, held, _first, build, sum)


def _first(pair: tuple[str, int]) -> str:
    return pair[0]


def _concat(lists: list[list[str]]) -> list[str]:
    return [item for part in lists for item in part]


@dataclass(frozen=True, slots=True)
class Successor:
    """The task a commit creates: a chain's next step, or a chord's callback (once the
    header is complete: ``chord`` is then the group id, ``index`` the committing
    member's place and ``result`` its result, JSON). Its envelope (fence 1) as stored,
    its queue's broker message when the script can push it (kombu's Redis transport on
    the store), the queued grace and its resurrection limit."""

    env: Envelope
    encoded: str
    message: publish.Queued | None
    grace_ms: int
    max_resurrections: int | str  # model/resurrections.py: an integer or a policy's text
    chord: str | None = None
    index: int = 0
    result: str = "null"
    gate: str = ""  # its flow control (limits.Gate.script_arg), '' for none


@dataclass(frozen=True, slots=True)
class Linked:
    """A task created by another's ending (``link=``: by its commit; ``link_error=``: by
    its filing in the DLQ): its envelope (fence 1) as stored, its resurrection limit
    and its flow-control gate (``limits.Gate.script_arg``, '' for none). The scanner
    leader dispatches it; the script that creates it publishes nothing."""

    env: Envelope
    encoded: str
    max_resurrections: int | str  # model/resurrections.py: an integer or a policy's text
    gate: str = ""

    def script_args(self) -> list[scripts.Arg]:
        """Its six ARGV entries, as _links.lua's callers take them."""
        nxt = self.env
        return [nxt.id, self.encoded, nxt.task, nxt.queue, self.max_resurrections, self.gate]


def commit(
    keys: KeySpace,
    env: Envelope,
    record: str,
    result_ttl_ms: int,
    keep_trail: bool = False,
    successor: Successor | None = None,
    links: Sequence[Linked] = (),
) -> scripts.ScriptCall[Transition]:
    """``keep_trail``: keep the task hash and history (``keys.trail``) with the result.
    ``successor``: the next step of a chain, created by the same script. ``links``: the
    callbacks (``link=``) created by the same script."""
    idem = keys.idempotency(env.task, env.idem_key) if env.idem_key else None
    args: list[scripts.Arg] = [env.id, env.fence, record, result_ttl_ms]
    if links:
        return _commit_linked(keys, env, idem, args, keep_trail, successor, links)
    if successor is None:
        return scripts.ScriptCall(
            scripts.COMMIT, keys.for_commit(env.id, idem, keep_trail), args, parse_transition
        )
    nxt, message = successor.env, successor.message
    args += [nxt.id, successor.encoded, nxt.task, nxt.queue, successor.grace_ms,
             successor.max_resurrections, message.payload if message else ""]  # fmt: skip
    if successor.chord is not None:
        args += [successor.index, successor.result, chords.KEEP_MS]
    if successor.gate or keys.ledger_ms:
        if successor.chord is None:
            args += ["", "", ""]  # ARGV[12..14] are a chord member's
        args += [successor.gate or "", 0, keys.ledger_ms]  # ARGV[15..17]: no callbacks
    return scripts.ScriptCall(
        scripts.COMMIT,
        keys.for_commit(
            env.id, idem, keep_trail, nxt.id, message.keys if message else None, successor.chord
        ),
        args,
        parse_transition,
    )


def commit_handing_over(
    keys: KeySpace,
    env: Envelope,
    record: str,
    result_ttl_ms: int,
    keep_trail: bool,
    handover: str,
) -> scripts.ScriptCall[Transition]:
    """commit.lua on a partitioned store for a step that brings about other tasks:
    it creates none, and records ``handover`` (``store.handover.record``) with the
    result instead, for the caller (or the scanner leader's sweep) to complete."""
    idem = keys.idempotency(env.task, env.idem_key) if env.idem_key else None
    args: list[scripts.Arg] = [env.id, env.fence, record, result_ttl_ms]
    args += [""] * 11  # ARGV[5..15]: no successor created here
    args += [0, keys.ledger_ms or "", handover]  # ARGV[16..18]: no callbacks either
    return scripts.ScriptCall(
        scripts.COMMIT, keys.for_commit_handing_over(env.id, idem, keep_trail), args,
        parse_transition,
    )  # fmt: skip


def _commit_linked(
    keys: KeySpace, env: Envelope, idem: str | None, args: list[scripts.Arg],
    keep_trail: bool, successor: Successor | None, links: Sequence[Linked],
) -> scripts.ScriptCall[Transition]:  # fmt: skip
    """commit.lua with callbacks: every successor argument given ('' when unused)."""
    message = successor.message if successor is not None else None
    if successor is None:
        args += [""] * 11
    else:
        nxt = successor.env
        args += [nxt.id, successor.encoded, nxt.task, nxt.queue, successor.grace_ms,
                 successor.max_resurrections, message.payload if message else ""]  # fmt: skip
        if successor.chord is not None:
            args += [successor.index, successor.result, chords.KEEP_MS]
        else:
            args += ["", "", ""]
        args.append(successor.gate)
    args.append(len(links))
    for link in links:
        args += link.script_args()
    args.append(keys.ledger_ms)
    return scripts.ScriptCall(
        scripts.COMMIT,
        keys.for_commit(
            env.id, idem, keep_trail, successor.env.id if successor else None,
            message.keys if message else None, successor.chord if successor else None,
            [link.env.id for link in links],
        ),
        args,
        parse_transition,
    )  # fmt: skip


def retry(
    keys: KeySpace,
    env: Envelope,
    nxt: Envelope,
    delay_ms: int,
    grace_ms: int,
    error: str,
    *,
    encoded: str,
) -> scripts.ScriptCall[Transition]:
    """Store ``nxt`` (fence + 1), encoded as ``encoded`` (signed when signing is on,
    the same string the broker gets), as the task's next incarnation."""
    assert nxt.fence == env.fence + 1, "the next incarnation must carry fence + 1"
    tail = history_tail(
        "retry", fence=env.fence, attempt=env.attempt, error=error, delay_ms=delay_ms
    )
    return scripts.ScriptCall(
        scripts.RETRY,
        keys.for_retry(env.id),
        [env.id, env.fence, encoded, delay_ms, grace_ms, tail, uuid.uuid4().hex],
        parse_transition,
    )
