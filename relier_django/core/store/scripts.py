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
from typing import Any, Generic, TypeVar

import redis
import redis.asyncio

from .connection import fast_lane

T = TypeVar("T")
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


PUSH = _load("push")
ABORT = _load("abort")
START = _load("start")
HEARTBEAT = _load("heartbeat")
COMMIT = _load("commit")
RETRY = _load("retry")
DEAD_LETTER = _load("dead_letter")
RESURRECT = _load("resurrect")
RESURRECTED = _load("resurrected")
LEADER = _load("leader")
LEADER_RELEASE = _load("leader_release")
HANDOFF = _load("handoff")
RELEASE = _load("release")
RELEASE_DONE = _load("release_done")
RELEASE_ABORT = _load("release_abort")
DLQ_DELETE = _load("dlq_delete")
CHECKPOINT = _load("checkpoint")
ADMIT = _load("admit")
LOCK_ACQUIRE = _load("lock_acquire")
LOCK_EXTEND = _load("lock_extend")
LOCK_RELEASE = _load("lock_release")
RATELIMIT = _load("ratelimit")

ALL: tuple[LuaScript, ...] = (
    PUSH, ABORT, START, HEARTBEAT, COMMIT, RETRY, DEAD_LETTER,
    RESURRECT, RESURRECTED, LEADER, LEADER_RELEASE, HANDOFF,
    RELEASE, RELEASE_DONE, RELEASE_ABORT, DLQ_DELETE, CHECKPOINT, ADMIT,
    LOCK_ACQUIRE, LOCK_EXTEND, LOCK_RELEASE, RATELIMIT,
)  # fmt: skip
