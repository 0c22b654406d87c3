"""Deaths seen from the store: a holder whose liveness connection is gone.

Each process that can hold a task holds a connection named after it and registers
itself (``store/liveness.py``). The leading scanner lists those names (``CLIENT LIST
TYPE pubsub``) and the registered processes every ``CHECK_S``; a registered process
whose name stays absent for ``GRACE_S`` is dead (one that unregistered left on purpose).
The leader then hands its tasks off (``orphans.lua``) and resurrects them at once.

The other scanners watch the leader alone, every ``WATCH_S``: ``CLIENT LIST ID`` of its
liveness connection (an id they learn from a list), and the leader key once every
``LEADER_READ_EVERY`` watches. Listing costs Redis about 0.65 µs per listed connection:
every scanner listing made a fleet's cost grow with the square of its size; this way it
grows with its size. When the leader's connection is not there (or the lease is free,
or changed hands) a follower lists everything from that check on, as a leader does,
until it sees a live leader again: processes that died with the leader (its own pool)
are missing from that first list, and a follower that finds the leader dead takes the
lease without waiting it out and hands their tasks off at once. A Redis without
``CLIENT LIST ID`` (before 6.2) gets the full list from every scanner, as before.

No false deaths, by design:

- a connection the server closed (a restart, a failover) comes back within a few
  hundred milliseconds; a new server run id (``INFO server``) pauses every verdict for
  ``PAUSE_S`` while the processes reconnect (a scanner's first look needs none: only a
  process it saw alive can be found dead). The run id and the registered holders are
  read with every ``FULL_EVERY``-th list and whenever the list differs from the one
  before: a restart changes the list (its clients are reconnecting) before any name has
  been missing for ``GRACE_S``, so no verdict is given without them;
- the liveness connection is never closed by its own side (no read timeout), so a
  slow network or a paused process leaves it open: those are the heartbeat TTL's;
- a Redis that refuses ``CLIENT LIST`` (some managed services) turns the check off:
  the TTL is then the only bound (``relier.W006`` says so at ``manage.py check``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import redis

from ..store import scripts
from ..store.clock import ServerClock
from ..store.keys import KeySpace
from ..store.liveness import connection_name, worker_of

logger = logging.getLogger("relier_django.resurrector")

CHECK_S = 0.25  # how often the leader lists the live connections
WATCH_S = 0.5  # how often the others watch the leader's connection
LEADER_READ_EVERY = 4  # a follower re-reads who leads every this many watches (2 s)
FULL_EVERY = 4  # a list also reads the run id and the registered holders (1 s)
GRACE_S = 1.0  # how long a name must stay absent: longer than a client's reconnect
PAUSE_S = 5.0  # after a server restart or failover, no verdict for this long
_CHUNK = 1000
# Error replies that say "not now", not "never": a cluster with a slot uncovered.
_PASSING = (redis.exceptions.ClusterDownError, redis.exceptions.TryAgainError)


@dataclass
class Deaths:
    """One scanner's view of which holders died. ``check`` is called every CHECK_S."""

    client: redis.Redis
    keys: KeySpace
    grace_s: float = GRACE_S
    pause_s: float = PAUSE_S
    disabled: bool = False
    _seen: dict[str, int] = field(default_factory=dict)  # worker -> last listed, Redis ms
    _missing: dict[str, float] = field(default_factory=dict)
    _run_id: str | None = None
    _last_check_ms: int = 0
    _paused_until: float = 0.0
    no_watch: bool = False  # the server has no CLIENT LIST ID: every check lists all
    _leader: str | None = None  # the leader as last read, and its liveness connection
    _leader_conn: str | None = None
    _watches: int = 0
    # The Redis clock, read with TIME once every few seconds (store/clock.py).
    clock: ServerClock = field(init=False)
    # Cadence (issue 37): the server's run id and the registered holders are read every
    # FULL_EVERY lists, and at once whenever the list changed; between, a list is one
    # command.
    _checks: int = 0
    _live: set[str] | None = None  # the holders listed last (None: read all next time)
    _registered: set[str] = field(default_factory=set)
    watching: bool = False  # the last check only watched a live leader

    def __post_init__(self) -> None:
        # Through self: check_deaths points a cluster's scanner at its new home master.
        self.clock = ServerClock(lambda: self.client)

    def check(self, watch: bool = False, leading: bool = False) -> dict[str, int]:
        """The workers newly found dead (seen alive, then absent for ``grace_s``), each
        with the last time its connection was listed (ms, Redis clock): its last sign of
        life. With ``watch`` (a scanner that does not lead), only the leader's connection
        is looked at while it is there: nothing is found dead then, and nothing is
        listed. ``leading``: this scanner holds the lease, so who leads is not read."""
        if self.disabled:
            return {}
        self.watching = bool(watch and not self.no_watch and self._leader_alive())
        if self.watching:
            return {}
        self._checks += 1
        full = self._checks % FULL_EVERY == 1 or self._live is None
        pipe = self.client.pipeline(transaction=False)
        pipe.client_list(_type="pubsub")
        if full:
            pipe.info("server")
            pipe.smembers(self.keys.holders)
        if not leading:
            pipe.get(self.keys.leader)
        try:
            replies = pipe.execute()
            clients = replies[0]
            live = {
                w for c in clients if (w := worker_of(self.keys.prefix, str(c.get("name", ""))))
            }
            if not full and live != self._live:
                # A process came or went (or the server restarted, and its clients are
                # reconnecting): read what a full check reads before any verdict.
                extra = self.client.pipeline(transaction=False)
                extra.info("server")
                extra.smembers(self.keys.holders)
                replies = [clients, *extra.execute(), *replies[1:]]
                full = True
        except _PASSING:
            # A Redis Cluster answers so while a master's slots are being failed over,
            # for every slot: no verdict now, the next check asks again.
            self._live = None
            return {}
        except redis.ResponseError as exc:
            self.disabled = True
            logger.warning(
                "CLIENT LIST is refused (%s): dead workers are found by heartbeat expiry "
                "only (HEARTBEAT_TTL_S)",
                exc,
            )
            return {}
        except redis.ConnectionError:
            self._live = None  # the next check is a full one: the server may be new
            self.clock.forget()
            raise
        now, now_ms = time.monotonic(), self.clock.now_ms()
        if full:
            info, self._registered = replies[1], {str(w) for w in replies[2]}
            self._saw_run_id(str(info.get("run_id", "")), now)
        self._live = live
        if leading:
            # Once it no longer leads, its first check lists and reads who does.
            self._leader = self._leader_conn = None
        else:
            self._learn_leader(replies[-1], clients)
        return self._verdicts(live, now, now_ms)

    def _learn_leader(self, leader: Any, clients: list[dict[str, Any]]) -> None:
        self._leader, self._leader_conn = (str(leader) if leader else None), None
        if leader:
            name = connection_name(self.keys.prefix, str(leader))
            self._leader_conn = next((str(c["id"]) for c in clients if c.get("name") == name),
                                     None)  # fmt: skip

    def _saw_run_id(self, run_id: str, now: float) -> None:
        if run_id != self._run_id:
            if self._run_id is not None:
                logger.warning(
                    "relier's Redis restarted or failed over (run id %s): no worker is "
                    "declared dead for %ss while they reconnect",
                    run_id,
                    self.pause_s,
                )
                self._paused_until = now + self.pause_s
                self.clock.forget()
            # A first look needs no pause: only a process seen alive can be found dead.
            self._run_id = run_id

    def _verdicts(self, live: set[str], now: float, now_ms: int) -> dict[str, int]:
        registered = self._registered
        for worker in live:
            self._seen[worker] = now_ms
            self._missing.pop(worker, None)
        if now < self._paused_until:
            self._missing.clear()
            self._last_check_ms = now_ms
            return {}
        for worker in registered - live - self._seen.keys():
            # Registered, never listed by this scanner: it may have lived until just
            # after the previous check, its last sign of life as far as this one knows.
            self._seen[worker] = self._last_check_ms or now_ms
        self._last_check_ms = now_ms
        for worker in self._seen.keys() - live:
            if worker not in registered:
                # Unregistered: it left on purpose (a warm shutdown), or a scanner
                # already handed its tasks off. Not a death to act on.
                del self._seen[worker]
                self._missing.pop(worker, None)
            else:
                self._missing.setdefault(worker, now)
        dead = {w: self._seen.pop(w) for w, since in self._missing.items()
                if now - since >= self.grace_s}  # fmt: skip
        for worker in dead:
            del self._missing[worker]
        return dead

    def _leader_alive(self) -> bool:
        """True when the leader read last still leads and its liveness connection is
        there: one CLIENT LIST ID (and a GET once every ``LEADER_READ_EVERY`` checks)
        instead of a list of every connection."""
        if self._leader is None or self._leader_conn is None:
            return False
        self._watches += 1
        pipe = self.client.pipeline(transaction=False)
        pipe.client_list(client_id=[self._leader_conn])
        reread = self._watches % LEADER_READ_EVERY == 0
        if reread:
            pipe.get(self.keys.leader)
        try:
            replies = pipe.execute()
        except _PASSING:
            return False
        except redis.ResponseError as exc:
            self.no_watch = True
            logger.info("CLIENT LIST ID is refused (%s): every scanner lists all", exc)
            return False
        name = connection_name(self.keys.prefix, self._leader)
        if not any(c.get("name") == name for c in replies[0]):
            return False  # gone, or reconnected under a new id: a list tells which
        if reread and replies[1] != self._leader:
            return False
        # While the leader watches, this scanner's verdicts are the leader's: what it
        # saw before is stale by the time it lists again, and is started afresh then.
        self._seen.clear()
        self._missing.clear()
        self._last_check_ms = 0
        self._live = None
        return True

    def forget(self, workers: Iterable[str]) -> None:
        """Unregister dead workers whose tasks were handed off (idempotent)."""
        names = list(workers)
        if names:
            self.client.srem(self.keys.holders, *names)


def held_by(
    client: redis.Redis, keys: KeySpace, workers: dict[str, int]
) -> list[tuple[str, str, int]]:
    """``(task_id, worker, last seen ms)`` of every task in the expiry index that one of
    ``workers`` (dead worker -> its last sign of life) holds: running, or reserved by a
    main process. One pipelined read per 1,000 tasks: paid once per death, not per
    check."""
    found: list[tuple[str, str, int]] = []
    ids = [str(i) for part in keys.parts() for i in client.zrange(part.expiry, 0, -1)]
    for at in range(0, len(ids), _CHUNK):
        chunk = ids[at : at + _CHUNK]
        pipe = client.pipeline(transaction=False)
        for task_id in chunk:
            pipe.hget(keys.task(task_id), "worker")
        for task_id, worker in zip(chunk, pipe.execute(), strict=True):
            if worker in workers:
                found.append((task_id, str(worker), workers[str(worker)]))
    return found


def hand_off(keys: KeySpace, held: Iterable[tuple[str, str, int]]) -> scripts.Call[int]:
    """orphans.lua over ``(task_id, dead worker, its last sign of life)`` triples, one
    call per partition."""

    def build(part: KeySpace, triples: list[tuple[str, str, int]]) -> scripts.ScriptCall[int]:
        args: list[scripts.Arg] = []
        for task_id, worker, seen_ms in triples:
            args += [task_id, worker, seen_ms]
        ids = [task_id for task_id, _, _ in triples]
        return scripts.ScriptCall(scripts.ORPHANS, part.for_orphans(ids), args, _count)

    return scripts.per_partition(keys, list(held), _task_of, build, sum)


def _task_of(triple: tuple[str, str, int]) -> str:
    return triple[0]


def _count(reply: Any) -> int:
    return int(reply)
