"""Lua scripts: loaded once from ``lua/``, called by EVALSHA, reloaded on NOSCRIPT.

Each script has exactly one typed wrapper elsewhere in the core (its only caller).
A wrapper returns a :class:`ScriptCall`, which runs on a sync client (``run``) or an
asyncio client (``arun``), so sync and async paths share one definition.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Generic, Protocol, TypeVar

import redis
import redis.asyncio

from .connection import fast_lane
from .keys import KeySpace

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
I = TypeVar("I")  # noqa: E741 -- an item of a batch
Arg = str | int | float | bytes

# How long a call's receipt (keys.receipt) is kept for its replay: far longer than any
# client's retry budget, short enough that receipts never pile up.
REPLAY_WINDOW_MS = 600_000


@dataclass(frozen=True, slots=True)
class LuaScript:
    """One ``.lua`` file. ``sha`` is computed locally, so no round trip is spent on it."""

    name: str
    source: str
    sha: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        # Redis names scripts by SHA-1; computed once here, not on every call.
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())

    def run(self, client: redis.Redis, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        lane = fast_lane(client)
        if lane is not None:
            try:
                try:
                    return lane.call("EVALSHA", self.sha, len(keys), *keys, *args)
                except redis.exceptions.NoScriptError:
                    return lane.call("EVAL", self.source, len(keys), *keys, *args)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                pass  # the client retries it (a replay, which every script here allows)
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            # After SCRIPT FLUSH, a restart or a failover: load and call in one go.
            return client.eval(self.source, len(keys), *keys, *args)

    async def arun(
        self, client: redis.asyncio.Redis, keys: Sequence[str], args: Sequence[Arg]
    ) -> Any:
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            return await client.eval(self.source, len(keys), *keys, *args)


@dataclass(frozen=True, slots=True)
class ScriptCall(Generic[T]):
    """A script with its KEYS and ARGV bound, and the parser of its reply."""

    script: LuaScript
    keys: Sequence[str]
    args: Sequence[Arg]
    parse: Callable[[Any], T]

    def run(self, client: redis.Redis) -> T:
        return self.parse(self.script.run(client, self.keys, self.args))

    async def arun(self, client: redis.asyncio.Redis) -> T:
        return self.parse(await self.script.arun(client, self.keys, self.args))


_INCLUDE = "-- @include "


class Call(Protocol[T_co]):
    """A script call, or a batch of them: run on a sync or an asyncio client."""

    def run(self, client: redis.Redis) -> T_co: ...

    async def arun(self, client: redis.asyncio.Redis) -> T_co: ...


@dataclass(frozen=True, slots=True)
class Batch(Generic[T]):
    """A batch script's calls, one per partition its items live in, and how their
    replies combine. Each call is safe to replay, so the batch is too: a retry after a
    failure part way re-runs the calls that had run, which answer the same."""

    calls: Sequence[ScriptCall[T]]
    merge: Callable[[list[T]], T]

    def run(self, client: redis.Redis) -> T:
        return self.merge([call.run(client) for call in self.calls])

    async def arun(self, client: redis.asyncio.Redis) -> T:
        return self.merge([await call.arun(client) for call in self.calls])


def per_partition(
    keys: KeySpace,
    items: Sequence[I],
    id_of: Callable[[I], str],
    build: Callable[[KeySpace, list[I]], ScriptCall[T]],
    merge: Callable[[list[T]], T],
) -> Call[T]:
    """``build``'s call for ``items``: one call on an unpartitioned store, else one per
    partition (a Redis Cluster runs a script on one slot), merged."""
    if not keys.tagged:
        return build(keys, list(items))
    groups: dict[KeySpace, list[I]] = {}
    for item in items:
        groups.setdefault(keys.of_task(id_of(item)), []).append(item)
    if not groups:
        return build(keys.at(0), [])
    return Batch([build(part, chunk) for part, chunk in groups.items()], merge)


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text()


def _load(name: str) -> LuaScript:
    # A line '-- @include _fragment' is replaced by lua/_fragment.lua: shared local
    # functions (the DLQ's index upkeep) written once, still one script per operation.
    lines = [
        _read(line.removeprefix(_INCLUDE).strip()) if line.startswith(_INCLUDE) else line
        for line in _read(name).splitlines(keepends=True)
    ]
    return LuaScript(name=name, source="".join(lines))


# Each script, and the one module that owns its operation: its typed wrapper lives there
# and nowhere else calls it (tests/unit/test_layout.py keeps this table true).
PUSH = _load("push")  # push.idempotency: store a new task, claim its key, admit it
ABORT = _load("abort")  # push.idempotency: undo a store whose publish failed
ADMIT = _load("admit")  # push.admission: the standalone admission check
START = _load("start")  # worker.fencing: one start per fence
HEARTBEAT = _load("heartbeat")  # worker.fencing: refresh and validate held tasks
COMMIT = _load("commit")  # worker.fencing: fenced result write
RETRY = _load("retry")  # worker.fencing: the next incarnation, fence + 1
HANDOFF = _load("handoff")  # worker.fencing: give tasks up on SIGTERM or a dead child
CHECKPOINT = _load("checkpoint")  # store.checkpoint: a running incarnation's checkpoint
PROGRESS = _load("progress")  # store.progress: a running incarnation's progress
RESURRECT = _load("resurrect")  # recovery.resurrector: lease expired tasks, fence + 1
RESURRECTED = _load("resurrected")  # recovery.resurrector: count what the broker took
LEADER = _load("leader")  # recovery.scanner: the leader lease
LEADER_RELEASE = _load("leader_release")  # recovery.scanner: give the lease up
DEAD_LETTER = _load("dead_letter")  # dlq.dead_letter: file a failure
RELEASE = _load("release")  # dlq.release: re-create an entry's task
RELEASE_DONE = _load("release_done")  # dlq.release: the broker took it
RELEASE_ABORT = _load("release_abort")  # dlq.release: the broker refused it
DLQ_DELETE = _load("dlq_delete")  # dlq.store: delete and purge
TICK = _load("tick")  # schedule.periodic: claim a periodic tick
TICK_DONE = _load("tick_done")  # schedule.periodic: record a tick handled
PRESENCE = _load("presence")  # worker.reservations: a worker says it is alive, or leaves
TAKE = _load("take")  # worker.intake: take a message and mark its task held, in one step
# worker.intake: take a message, keeping a copy until it is registered (broker apart)
TAKE_INFLIGHT = _load("take_inflight")
RESTORE_INFLIGHT = _load("restore_inflight")  # recovery.inflight: a dead taker's copies back
ORPHANS = _load("orphans")  # recovery.deaths: hand off the tasks of a holder found dead
SCHEDULE_TAKE = _load("schedule_take")  # schedule.dispatch: lease the due tasks
SCHEDULE_SENT = _load("schedule_sent")  # schedule.dispatch: the broker took them
ADOPT = _load("adopt")  # worker.adoption: store a plain Celery message as a task
CANCEL = _load("cancel")  # store.cancel: take a task back, or fence off its run
LOCK_ACQUIRE = _load("lock_acquire")  # extras.lock
LOCK_EXTEND = _load("lock_extend")  # extras.lock
LOCK_RELEASE = _load("lock_release")  # extras.lock
RATELIMIT = _load("ratelimit")  # extras.ratelimit: one hit on a view's limiter
HANDOVER_STORE = _load("handover_store")  # store.handover: a successor in its partition
HANDOVER_DONE = _load("handover_done")  # store.handover: forget a completed hand-over
CHORD_MEMBER = _load("chord_member")  # store.handover: a member's result, in its chord's partition

OWNERS: dict[LuaScript, str] = {
    PUSH: "push.idempotency", ABORT: "push.idempotency", ADMIT: "push.admission",
    START: "worker.fencing", HEARTBEAT: "worker.fencing", COMMIT: "worker.fencing",
    RETRY: "worker.fencing", HANDOFF: "worker.fencing", CHECKPOINT: "store.checkpoint",
    PROGRESS: "store.progress",
    RESURRECT: "recovery.resurrector", RESURRECTED: "recovery.resurrector",
    LEADER: "recovery.scanner", LEADER_RELEASE: "recovery.scanner",
    DEAD_LETTER: "dlq.dead_letter", RELEASE: "dlq.release", RELEASE_DONE: "dlq.release",
    RELEASE_ABORT: "dlq.release", DLQ_DELETE: "dlq.store", LOCK_ACQUIRE: "extras.lock",
    LOCK_EXTEND: "extras.lock", LOCK_RELEASE: "extras.lock", RATELIMIT: "extras.ratelimit",
    TICK: "schedule.periodic", TICK_DONE: "schedule.periodic",
    PRESENCE: "worker.reservations", TAKE: "worker.intake", TAKE_INFLIGHT: "worker.intake",
    RESTORE_INFLIGHT: "recovery.inflight", ORPHANS: "recovery.deaths",
    SCHEDULE_TAKE: "schedule.dispatch", SCHEDULE_SENT: "schedule.dispatch",
    CANCEL: "store.cancel", ADOPT: "worker.adoption",
    HANDOVER_STORE: "store.handover", HANDOVER_DONE: "store.handover",
    CHORD_MEMBER: "store.handover",
}  # fmt: skip

ALL: tuple[LuaScript, ...] = tuple(OWNERS)
