"""The resurrector: brings back tasks whose heartbeat (or queued grace) expired.

A pass reads the expiry index by score (``ZRANGEBYSCORE -inf <Redis now> LIMIT``),
so it costs O(expired), not O(in flight). For each batch of up to ``SCRIPT_BATCH``
expired tasks, one ``resurrect.lua`` call re-checks each deadline on the Redis clock,
takes a lease and mints the next fence; each stored envelope is re-published to the
recovery queue (in one producer batch: one round trip to a Redis broker); one
``resurrected.lua`` call then counts the resurrections the broker accepted and turns
their leases into a queued grace. A task past its ``max_resurrections`` goes to the
DLQ instead. A batch costs two round trips to the store and one to the broker, not
three per task. Up to ``LEASE_AHEAD`` batches are leased one call after the other
before any of them is published, and recorded one call after the other once all are.

``scanner.Scanner`` runs passes while it holds the leader lease, so of all the
resurrectors running (one per worker, plus any standalone) one scans at a time; the
script re-checks and moves each task's deadline as it leases it, so even two
concurrent passes re-dispatch each task once.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import redis

from ..broker import publish
from ..broker.depth import queue_depth
from ..dlq import dead_letter as dlq
from ..model import events
from ..model.config import Config
from ..model.envelope import Envelope, decode
from ..model.errors import EnvelopeError
from ..model.failure import Failure, Reason
from ..model.transition import history_tail
from ..store import scripts
from ..store.connection import sync_client
from ..store.keys import KeySpace

T = TypeVar("T")

logger = logging.getLogger("relier_django.resurrector")


@dataclass(frozen=True, slots=True)
class PassReport:
    """What one pass did. ``outcomes`` counts per task: resurrected, dead_lettered,
    skipped (alive again, or leased by another pass), send_failed, unreadable (its
    stored copy could not be read, so it was dead-lettered)."""

    expired: int = 0
    deferred: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def resurrected(self) -> int:
        return self.outcomes.get("resurrected", 0)


@dataclass(frozen=True, slots=True)
class _Leased:
    """resurrect.lua's reply: code 1 leased, 2 over the limit, 0 skipped, -1 failed
    (``env`` then holds the script's error). ``death``: how its holder died, as far
    as is known (resurrect.lua's RETURNS)."""

    code: int
    fence: int = -1
    env: str = ""
    resurrections: int = 0
    stored: dlq.StoredTask | None = None
    death: str = ""


def _parse_lease(task_id: str, reply: list[Any]) -> _Leased:
    code = int(reply[0])
    if code == -1:
        return _Leased(-1, env=str(reply[1]))  # the script's error for this task
    if code == 0:
        return _Leased(0)
    fence = int(reply[1])
    stored = dlq.StoredTask(task_id, fence, reply[4], reply[5], reply[6] or None)
    death = str(reply[7]) if len(reply) > 7 else ""
    return _Leased(code, fence, reply[2], int(reply[3]), stored, death)


# Tasks per resurrect.lua / resurrected.lua call. A call costs one round trip however
# many tasks it carries (a round trip is ~25 us of redis-server CPU, the work per task
# a few us), while keeping each script's hold on Redis near a millisecond.
SCRIPT_BATCH = 100

# Script batches leased before the first of them is published. The store then serves
# a window's calls back to back, its caches still warm, instead of one call between
# each two broker publishes: about 4 ms less Redis CPU per 1,000 tasks (see
# docs/benchmarks.md). A window of 1,000 tasks is published well within a second in
# one producer batch each 100, far inside resurrect_lease_s (30 s by default); if a
# batch fails and its tasks go one by one, a slow broker could outlast a lease: that
# costs a duplicate dispatch, which the fences refuse, never a lost task.
LEASE_AHEAD = 10


class Resurrector:
    """One scanner's passes over the expiry index."""

    def __init__(self, app: Any, config: Config, scanner_id: str) -> None:
        self.app = app
        self.config = config
        self.scanner_id = scanner_id
        self.keys = KeySpace.of(config)
        self._turn = 0  # the partition the next pass starts after

    @property
    def client(self) -> redis.Redis:
        return sync_client(self.config)

    def expired_ids(self) -> list[str]:
        """Up to ``resurrect_batch`` ids whose deadline passed, by the Redis clock. With
        partitions, each pass starts at the next partition, so a busy one never keeps
        another's expired tasks waiting more than a pass or two."""
        seconds, micros = self.client.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        parts = self.keys.parts()
        self._turn = (self._turn + 1) % len(parts)
        batch = self.config.resurrect_batch
        pipe = self.client.pipeline(transaction=False)
        for part in parts[self._turn :] + parts[: self._turn]:
            pipe.zrangebyscore(part.expiry, "-inf", now_ms, start=0, num=batch)
        # A client that decodes replies (connection.py): ids are str.
        each = cast("list[list[str]]", pipe.execute())
        return [task_id for ids in each for task_id in ids][:batch]

    def newly_due(self, since_ms: int | None, now_ms: int | None = None) -> tuple[bool, int]:
        """Whether a deadline passed in ``[since_ms, now]`` (Redis clock), and now.

        A leader asks this every death check: a task handed off (its deadline set to
        now), a heartbeat TTL that ran out or a lease that lapsed is resurrected within
        a check instead of at the next pass. Only deadlines that passed since the last
        look count, so an expired task a pass leaves (the recovery queue is full) does
        not make every check a pass. One round trip: the earliest deadline after
        ``since_ms`` (in each partition) is compared with the time read in the same
        pipeline (or ``now_ms``, the caller's reading of the Redis clock). ``since_ms``
        itself is included: a deadline set in the millisecond of the last look, after
        it, is not missed (one set before it costs one extra pass)."""
        pipe = self.client.pipeline(transaction=False)
        # A cluster's pipeline refuses TIME (it names no key): read apart, just after.
        in_pipe = not self.config.cluster and now_ms is None
        if in_pipe:
            pipe.time()
        after = "-inf" if since_ms is None else since_ms
        for part in self.keys.parts():
            pipe.zrangebyscore(part.expiry, after, "+inf", start=0, num=1, withscores=True)
        earliest = pipe.execute()
        if now_ms is None:
            seconds, micros = earliest.pop(0) if in_pipe else self.client.time()
            now_ms = int(seconds) * 1000 + int(micros) // 1000
        due = since_ms is not None and any(e and float(e[0][1]) <= now_ms for e in earliest)
        return due, now_ms

    def recovery_depth(self) -> int:
        """Messages waiting in the recovery queue (0 when it does not exist yet)."""
        return queue_depth(self.app, self.config.recovery_queue)

    def run_pass(self) -> PassReport:
        started = time.perf_counter()
        ids = self.expired_ids()
        if not ids:
            return PassReport(seconds=time.perf_counter() - started)
        depth = self.recovery_depth()
        if depth >= self.config.recovery_max_depth:
            logger.warning(
                "resurrection deferred: recovery queue %s holds %s messages (limit %s); "
                "%s expired tasks wait for the next pass",
                self.config.recovery_queue,
                depth,
                self.config.recovery_max_depth,
                len(ids),
            )
            return PassReport(len(ids), len(ids), {}, time.perf_counter() - started)
        outcomes: Counter[str] = Counter()
        workers = min(self.config.max_concurrent_sends, len(ids))
        window = SCRIPT_BATCH * LEASE_AHEAD
        with ThreadPoolExecutor(workers, thread_name_prefix="relier-resurrect") as pool:
            for at in range(0, len(ids), window):
                outcomes.update(self._resurrect_window(ids[at : at + window], pool))
        report = PassReport(len(ids), 0, dict(+outcomes), time.perf_counter() - started)
        logger.info(
            "resurrector pass scanner=%s expired=%s %s in %.1f ms",
            self.scanner_id,
            report.expired,
            report.outcomes,
            report.seconds * 1000,
        )
        return report

    def _resurrect_window(self, ids: list[str], pool: ThreadPoolExecutor) -> Counter[str]:
        """Lease ``ids`` a script batch per call, publish each batch's leased tasks,
        then record the published ones a script batch per call."""
        outcomes: Counter[str] = Counter()
        leased: list[tuple[list[str], list[_Leased]]] = []
        for at in range(0, len(ids), SCRIPT_BATCH):
            chunk = ids[at : at + SCRIPT_BATCH]
            try:
                leased.append((chunk, self._lease(chunk)))
            except Exception:
                # The leases (or the untouched deadlines) keep these tasks covered:
                # a later pass retries them. Never silent.
                logger.exception(
                    "resurrection failed for %s task(s); a later pass retries them",
                    len(chunk),
                )
                outcomes["error"] += len(chunk)
        published: list[list[tuple[Envelope, str]]] = []
        for chunk, leases in leased:
            ready = self._settle_all(chunk, leases, outcomes)
            sent = self._publish_all(ready, pool)
            outcomes["send_failed"] += len(ready) - len(sent)
            if sent:
                published.append(sent)
        deaths = {
            i: lease.death
            for chunk, leases in leased
            for i, lease in zip(chunk, leases, strict=True)
        }
        for sent in published:
            try:
                recorded = self._record(sent, deaths)
            except Exception:
                # Published but not counted: each lease runs out and a later pass
                # re-dispatches the task with a newer fence (the older is refused).
                # The call may have recorded some before failing: all are counted here.
                logger.exception(
                    "recording %s resurrection(s) failed; those left unrecorded come "
                    "back once their lease runs out",
                    len(sent),
                )
                outcomes["error"] += len(sent)
            else:
                outcomes["resurrected"] += recorded
                # The fence moved between the lease and the record (a release, say):
                # published, and refused at start as stale.
                outcomes["superseded"] += len(sent) - recorded
        return outcomes

    def _lease(self, ids: list[str]) -> list[_Leased]:
        """resurrect.lua over ``ids``: one call per partition, one reply per task."""
        lease_ms = int(self.config.resurrect_lease_s * 1000)
        ttl_ms = int(self.config.heartbeat_ttl_s * 1000)
        grace_ms = int(self.config.queued_grace_s * 1000)

        def build(part: KeySpace, chunk: list[str]) -> scripts.ScriptCall[dict[str, _Leased]]:
            return scripts.ScriptCall(
                scripts.RESURRECT, part.for_resurrect(chunk),
                [lease_ms, self.scanner_id, uuid.uuid4().hex, ttl_ms, grace_ms, *chunk],
                lambda replies: {i: _parse_lease(i, r)
                                 for i, r in zip(chunk, replies, strict=True)},
            )  # fmt: skip

        leased = scripts.per_partition(self.keys, ids, str, build, _merged).run(self.client)
        return [leased[task_id] for task_id in ids]

    def _settle_all(
        self, ids: list[str], leases: list[_Leased], outcomes: Counter[str]
    ) -> list[tuple[Envelope, str]]:
        """Settle each lease (counted in ``outcomes``); returns those to publish."""
        ready: list[tuple[Envelope, str]] = []
        for task_id, lease in zip(ids, leases, strict=True):
            if lease.code == -1:
                logger.error(
                    "resurrection failed task_id=%s: %s; a later pass retries it",
                    task_id,
                    lease.env,
                )
                outcomes["error"] += 1
                continue
            try:
                settled = self._settle(lease, ready)
            except Exception:
                logger.exception("resurrection failed task_id=%s; a later pass retries it", task_id)
                settled = "error"
            if settled:
                outcomes[settled] += 1
        return ready

    def _settle(self, lease: _Leased, ready: list[tuple[Envelope, str]]) -> str:
        """Dead-letter what cannot come back; queue the rest in ``ready`` for publishing
        (returns '' for those: their outcome is known once published)."""
        if lease.code == 0 or lease.stored is None:
            return "skipped"
        try:
            # Verified before it is re-signed: a stored copy edited in Redis must not
            # come back out with a valid signature.
            env = decode(lease.env, self.config.signer)
        except EnvelopeError as exc:
            held = "dying" if lease.code == 2 else "queued"
            return self._dead_letter_unreadable(lease.stored, lease.env, exc, held)
        if lease.code == 2:
            # The stored copy may be as pushed: fence and count are the task hash's.
            dying = dataclasses.replace(env, fence=lease.fence, resurrections=lease.resurrections)
            return self._dead_letter(dying, lease.resurrections, lease.death)
        nxt = dataclasses.replace(env, fence=lease.fence, resurrections=lease.resurrections + 1)
        ready.append((nxt, nxt.encode(self.config.signer)))
        return ""

    def _publish_all(
        self, ready: list[tuple[Envelope, str]], pool: ThreadPoolExecutor
    ) -> list[tuple[Envelope, str]]:
        """Publish ``ready``; returns those the broker accepted. One producer batch
        first (one round trip to a Redis broker); if it fails, or this kombu cannot
        batch, one publish per task, ``max_concurrent_sends`` at a time."""
        if len(ready) > 1:
            try:
                if publish.send_batch(self.app, ready, self.config.recovery_queue):
                    return ready
            except Exception:
                logger.warning(
                    "batched resurrection publish of %s task(s) failed; publishing one by one",
                    len(ready),
                    exc_info=True,
                )
        return [d for d, ok in zip(ready, pool.map(self._publish, ready), strict=True) if ok]

    def _publish(self, dispatch: tuple[Envelope, str]) -> bool:
        env, encoded = dispatch
        try:
            publish.send(self.app, env, encoded, queue=self.config.recovery_queue)
            return True
        except Exception:
            logger.error(
                "resurrection publish failed task_id=%s fence=%s; retried after the lease",
                env.id,
                env.fence,
                exc_info=True,
            )
            return False

    def _record(self, sent: list[tuple[Envelope, str]], deaths: dict[str, str]) -> int:
        """resurrected.lua over ``sent``; returns how many it recorded. ``deaths``: how
        each task's holder died, by task id, for ``task_resurrected``."""
        grace_ms = int(self.config.queued_grace_s * 1000)
        # Re-stored only when signed: see resurrected.lua (key rotation).
        signed = self.config.signer is not None

        def build(
            part: KeySpace, chunk: list[tuple[Envelope, str]]
        ) -> scripts.ScriptCall[dict[str, bool]]:
            ids = [env.id for env, _ in chunk]
            args: list[scripts.Arg] = [grace_ms]
            for env, encoded in chunk:
                tail = history_tail("resurrected", fence=env.fence, scanner=self.scanner_id)
                args += (env.id, env.fence, encoded if signed else "", tail)
            return scripts.ScriptCall(
                scripts.RESURRECTED, part.for_resurrected(ids), args,
                lambda replies: {i: bool(int(r)) for i, r in zip(ids, replies, strict=True)},
            )  # fmt: skip

        done = scripts.per_partition(self.keys, sent, _id_of, build, _merged).run(self.client)
        recorded = [done[env.id] for env, _ in sent]
        for (env, _), ok in zip(sent, recorded, strict=True):
            logger.warning(
                "resurrected task_id=%s task=%s fence=%s resurrections=%s cause=%s%s",
                env.id,
                env.task,
                env.fence,
                env.resurrections,
                deaths.get(env.id) or "unknown",
                "" if ok else " (superseded meanwhile)",
            )
            if ok:
                events.emit(events.TaskResurrected(
                    env.id, env.task, env.fence, env.resurrections, self.config.recovery_queue,
                    deaths.get(env.id, ""),
                ))  # fmt: skip
        return sum(recorded)

    def _dead_letter_unreadable(
        self, stored: dlq.StoredTask, raw: str, exc: EnvelopeError, held: str
    ) -> str:
        # Nothing can run it again, and leaving it would re-lease it every pass forever:
        # the DLQ keeps the stored text for an operator, with the reason.
        failure = Failure(
            Reason(exc.reason), type(exc).__name__,
            f"the stored copy of the task cannot be read: {exc}", worker=self.scanner_id,
        )  # fmt: skip
        ttl_ms = int(self.config.result_ttl_s * 1000)
        call = dlq.dead_letter(
            self.keys, failure, ttl_ms, env=None, raw=raw, stored=stored, held=held
        )
        if call.run(self.client).accepted:
            logger.error(
                "dead-lettered task_id=%s reason=%s: stored envelope unreadable: %s",
                stored.task_id,
                exc.reason,
                exc,
            )
            return "unreadable"
        return "skipped"

    def _dead_letter(self, env: Envelope, resurrections: int, death: str = "") -> str:
        # The last death's cause goes in the entry ('cause'): an operator deciding
        # whether to release it needs to know an OOM loop from a lost host. With limits
        # by cause, the limit reached is the last death's (resurrect.lua's limit_of).
        failure = Failure(
            Reason.RESURRECTION_LIMIT, None,
            f"its worker died or stalled {resurrections + 1} times "
            f"(max_resurrections={resurrections}"
            + (f" for its last death: {death})" if death else ")"),
            worker=self.scanner_id, extra={"cause": death} if death else {},
        )  # fmt: skip
        ttl_ms = int(self.config.result_ttl_s * 1000)
        call = dlq.dead_letter(
            self.keys, failure, ttl_ms, env=env, signer=self.config.signer, held="dying"
        )
        moved = call.run(self.client)
        if moved.accepted:
            logger.error(
                "dead-lettered task_id=%s reason=resurrection_limit cause=%s",
                env.id,
                death or "unknown",
            )
            return "dead_lettered"
        return "skipped"


def _merged(parts: list[dict[str, T]]) -> dict[str, T]:
    """One partition's replies by task id, merged: the caller restores its order."""
    return {task_id: reply for part in parts for task_id, reply in part.items()}


def _id_of(dispatch: tuple[Envelope, str]) -> str:
    return dispatch[0].id
