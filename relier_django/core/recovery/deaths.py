"""Deaths seen from the store: a holder whose liveness connection is gone.

Each process that can hold a task holds a connection named after it and registers
itself (``store/liveness.py``). The leading scanner lists those names (``CLIENT LIST
TYPE pubsub``) and the registered processes every ``CHECK_S``; a registered process
whose name stays absent for ``GRACE_S`` is dead (one that unregistered left on purpose).
The leader then hands its tasks off (``orphans.lua``) and resurrects them at once.

The other scanners watch the leader alone, every ``CHECK_S``: ``CLIENT LIST ID`` of its
liveness connection (an id they learn from a list), and the leader key once every
``LEADER_READ_EVERY`` checks. Listing costs Redis about 0.65 µs per listed connection:
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
  process it saw alive can be found dead);
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
from ..store.keys import KeySpace
from ..store.liveness import connection_name, worker_of

logger = logging.getLogger("relier_django.resurrector")

CHECK_S = 0.25  # how often the leader lists the live connections (the others: watch it)
LEADER_READ_EVERY = 4  # a follower re-reads who leads every this many checks (1 s)
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

    def check(self, watch: bool = False) -> dict[str, int]:
        """The workers newly found dead (seen alive, then absent for ``grace_s``), each
        with the last time its connection was listed (ms, Redis clock): its last sign of
        life. With ``watch`` (a scanner that does not lead), only the leader's connection
        is looked at while it is there: nothing is found dead then, and nothing is
        listed."""
        if self.disabled:
            return {}
        if watch and not self.no_watch and self._leader_alive():
            return {}
        pipe = self.client.pipeline(transaction=False)
        pipe.time()
        pipe.info("server")
        pipe.client_list(_type="pubsub")
        pipe.smembers(self.keys.holders)
        pipe.get(self.keys.leader)
        try:
            (secs, micros), info, clients, registered, leader = pipe.execute()
        except _PASSING:
            # A Redis Cluster answers so while a master's slots are being failed over,
            # for every slot: no verdict now, the next check asks again.
            return {}
        except redis.ResponseError as exc:
            self.disabled = True
            logger.warning(
                "CLIENT LIST is refused (%s): dead workers are found by heartbeat expiry "
                "only (HEARTBEAT_TTL_S)",
                exc,
            )
            return {}
        now, now_ms = time.monotonic(), int(secs) * 1000 + int(micros) // 1000
        prefix = self.keys.prefix
        live = {w for c in clients if (w := worker_of(prefix, str(c.get("name", ""))))}
        self._leader, self._leader_conn = (str(leader) if leader else None), None
        if leader:
            name = connection_name(prefix, str(leader))
            self._leader_conn = next((str(c["id"]) for c in clients if c.get("name") == name),
                                     None)  # fmt: skip
        run_id = str(info.get("run_id", ""))
        if run_id != self._run_id:
            if self._run_id is not None:
                logger.warning(
                    "relier's Redis restarted or failed over (run id %s): no worker is "
                    "declared dead for %ss while they reconnect",
                    run_id,
                    self.pause_s,
                )
                self._paused_until = now + self.pause_s
            # A first look needs no pause: only a process seen alive can be found dead.
            self._run_id = run_id
        for worker in live:
            self._seen[worker] = now_ms
            self._missing.pop(worker, None)
        if now < self._paused_until:
            self._missing.clear()
            self._last_check_ms = now_ms
            return {}
        for worker in set(registered) - live - self._seen.keys():
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
