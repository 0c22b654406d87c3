"""Flow control as it stands, read from the store: per scope, the slots in use and by
which tasks, the tasks parked per key and how long the oldest has waited, the rate's
reservations (docs/flow-control.md, "Seeing it").

The scripts keep the scopes in use in two indexes (``KeySpace.limit_scopes``: a set
of the scopes with slots held or tasks parked, emptied as they go idle;
``KeySpace.limit_rates``: rate scopes by when their reservation expires), so the
reader lists them in one round trip, never by a SCAN of the keyspace, which a metrics
scrape would pay on every call. The figures then take three more round trips (the
scopes, their tasks, each line's oldest), on the Redis clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis

from ..model.config import Config
from ..model.limits import emission
from ..model.rates import Rate
from ..store.connection import execute_timed, timed_pipeline
from ..store.keys import KeySpace
from .live import as_text

_SEP = "|"  # model/limits.py's separator between a scope and its key


def family_of(scope: str) -> str:
    """A scope's family: the scope without its key (``t:<task>`` or ``n:<limit>``), the
    label metrics use, so that their series grow with the limits, not the keys."""
    return scope.partition(_SEP)[0]


@dataclass(frozen=True, slots=True)
class Holder:
    """A task holding one of a scope's slots."""

    task_id: str
    name: str
    state: str  # its hash's state: queued, reserved, running, scheduled (a retry's wait)
    worker: str  # the worker holding it now ('' when none does)
    fence: int  # the fence it was granted the slot at

    def to_json(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "name": self.name, "state": self.state,
                "worker": self.worker, "fence": self.fence}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ParkedKey:
    """The tasks parked under one key of a scope, served in push order."""

    key: str  # '' for a scope without keys
    parked: int
    oldest_task_id: str
    oldest_wait_s: float | None  # since the oldest was parked, on the Redis clock

    def to_json(self) -> dict[str, Any]:
        wait = None if self.oldest_wait_s is None else round(self.oldest_wait_s, 3)
        return {"key": self.key, "parked": self.parked, "oldest_task_id": self.oldest_task_id,
                "oldest_wait_s": wait}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Scope:
    """One scope in use: its slots (with their holders), its parked tasks by key in
    turn order, and its rate's reservations when it has a rate."""

    scope: str
    capacity: int | None  # from its tasks' hashes; None when no task says (a rate only)
    holders: tuple[Holder, ...] = ()
    parked: tuple[ParkedKey, ...] = ()
    rate_reserved_until_ms: int | None = None  # the rate's reservations run until then
    rate_next_free_ms: int | None = None  # the earliest a dispatch may go (rate known)

    @property
    def family(self) -> str:
        return family_of(self.scope)

    @property
    def in_use(self) -> int:
        return len(self.holders)

    @property
    def parked_total(self) -> int:
        return sum(p.parked for p in self.parked)

    @property
    def oldest_wait_s(self) -> float | None:
        waits = [p.oldest_wait_s for p in self.parked if p.oldest_wait_s is not None]
        return max(waits) if waits else None

    def to_json(self) -> dict[str, Any]:
        wait = self.oldest_wait_s
        return {
            "scope": self.scope, "family": self.family, "capacity": self.capacity,
            "in_use": self.in_use, "parked": self.parked_total,
            "oldest_wait_s": None if wait is None else round(wait, 3),
            "holders": [h.to_json() for h in self.holders],
            "parked_by_key": [p.to_json() for p in self.parked],
            "rate_reserved_until_ms": self.rate_reserved_until_ms,
            "rate_next_free_ms": self.rate_next_free_ms,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class Limits:
    """One reading of every scope in use. ``at_ms`` is the Redis clock's."""

    at_ms: int
    scopes: tuple[Scope, ...]  # by scope name

    def scope(self, name: str) -> Scope | None:
        return next((s for s in self.scopes if s.scope == name), None)

    def by_family(self) -> dict[str, tuple[int, int]]:
        """(slots in use, parked) summed per family (every key of a task or a limit)."""
        found: dict[str, tuple[int, int]] = {}
        for s in self.scopes:
            used, parked = found.get(s.family, (0, 0))
            found[s.family] = (used + s.in_use, parked + s.parked_total)
        return found

    def to_json(self) -> dict[str, Any]:
        return {"at_ms": self.at_ms, "scopes": [s.to_json() for s in self.scopes]}


def _discover(client: redis.Redis, keys: KeySpace) -> tuple[set[str], set[str]]:
    """The scopes with slots held or tasks parked, and the rate scopes with a
    reservation still running, from the two indexes the scripts keep: one round trip,
    whatever the size of the store."""
    pipe = client.pipeline(transaction=False)
    pipe.smembers(keys.limit_scopes)
    pipe.zrange(keys.limit_rates, 0, -1)
    held, rated = pipe.execute()
    return {as_text(s) for s in held}, {as_text(s) for s in rated}


def read(client: redis.Redis, config: Config, rates: Mapping[str, Rate] | None = None) -> Limits:
    """Every scope in use. ``rates``: the rate of each family that has one
    (``t:<task>``, ``n:<limit>``); the named limits' are the configuration's. With its
    rate, a scope's next free dispatch time is known; without it, only how far its
    reservations run.

    Flow control needs an unpartitioned store: a partitioned one reads as no scopes."""
    keys = KeySpace.of(config)
    if keys.tagged:
        return Limits(0, ())
    known = {f"n:{name}": lim.rate for name, lim in config.named_limits().items() if lim.rate}
    known.update(rates or {})
    slot_scopes, rate_scopes = _discover(client, keys)
    order = sorted(slot_scopes | rate_scopes)
    pipe = timed_pipeline(client)
    for scope in order:
        pipe.hgetall(keys.limit_run(scope))
        pipe.lrange(keys.limit_ring(scope), 0, -1)
        pipe.get(keys.limit_rate(scope))
    now_ms, replies = execute_timed(client, pipe)
    runs = [{as_text(k): int(v) for k, v in r.items()} for r in replies[0::3]]
    rings = [[as_text(k) for k in r] for r in replies[1::3]]
    tats = [None if t is None else int(t) for t in replies[2::3]]
    pipe = client.pipeline(transaction=False)
    for run, ring, scope in zip(runs, rings, order, strict=True):
        for task_id in run:
            pipe.hmget(keys.task(task_id), "name", "state", "worker", "lim_n")
        for key in ring:
            pipe.llen(keys.limit_parked(scope, key))
            pipe.lindex(keys.limit_parked(scope, key), 0)
    second = iter(pipe.execute() if len(pipe) else [])
    heads: list[list[tuple[str, int, str]]] = []
    holders: list[list[tuple[str, list[Any]]]] = []
    for run, ring in zip(runs, rings, strict=True):
        holders.append([(task_id, next(second)) for task_id in run])
        heads.append([(key, int(next(second)), as_text(next(second))) for key in ring])
    pipe = client.pipeline(transaction=False)
    for each in heads:
        for _, _, oldest in each:
            pipe.hmget(keys.task(oldest), "parked_ms", "lim_n")
    third = iter(pipe.execute() if len(pipe) else [])
    scopes = []
    for i, scope in enumerate(order):
        capacities = []
        held = []
        for task_id, (name, state, worker, capacity) in holders[i]:
            held.append(Holder(task_id, as_text(name), as_text(state), as_text(worker),
                               runs[i][task_id]))  # fmt: skip
            capacities.append(capacity)
        parked = []
        for key, count, oldest in heads[i]:
            parked_ms, capacity = next(third)
            capacities.append(capacity)
            wait = None if parked_ms is None else max(0.0, (now_ms - int(parked_ms)) / 1000)
            parked.append(ParkedKey(key, count, oldest, wait))
        capacity = next((int(c) for c in capacities if c not in (None, "", b"")), None)
        tat, rate = tats[i], known.get(family_of(scope))
        next_free = None
        if tat is not None and rate is not None:
            next_free = max(now_ms, tat - emission(rate)[1])
        scopes.append(Scope(scope, capacity, tuple(held), tuple(parked), tat, next_free))
    return Limits(now_ms, tuple(scopes))
