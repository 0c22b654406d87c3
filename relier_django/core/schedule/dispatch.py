"""Dispatch of scheduled tasks: the due ones leave the schedule index for the broker.

A scheduled task (a countdown, an eta, a retry's backoff) waits in ``<p>:sched`` by
due time on the Redis clock, in no worker's memory. The scanner leader reads the due
ids (``ZRANGEBYSCORE -inf <Redis now>``: O(due)), ``schedule_take.lua`` re-checks each
due time and leases it (state ``queued``, covered by the expiry index for the lease),
the stored envelope is published to the task's own queue, and ``schedule_sent.lua``
turns the lease into a queued grace. A leader that dies between the two leaves a
lease that runs out; the resurrector then re-dispatches the task with the next fence,
so it runs once. A task whose ``expires=`` passed before it was due is dead-lettered
(``expired``) instead.

Between passes the leader sleeps until the earliest due time, not a fixed interval:
it blocks on ``<p>:sched:wake``, which a push that makes a new earliest due time
fills, so a task due in 50 ms is dispatched then (docs/scheduling.md).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis

from ..broker import publish
from ..dlq import dead_letter as dlq
from ..model import events
from ..model.config import Config
from ..model.envelope import Envelope, decode
from ..model.errors import EnvelopeError
from ..model.failure import Failure, Reason
from ..store import scripts
from ..store.clock import ServerClock
from ..store.connection import execute_timed, sync_client, timed_pipeline
from ..store.keys import KeySpace

logger = logging.getLogger("relier_django.schedule")

BATCH = 100  # due tasks per schedule_take.lua call
# On a Redis Cluster the leader polls for a new earliest due time this often (wait()).
CLUSTER_NAP_S = 0.1
# The leader reads the earliest due time again at least this often, wake-up or not.
HEAD_FRESH_S = 1.0


@dataclass(frozen=True, slots=True)
class _Taken:
    task_id: str
    fence: int
    stored: str  # the envelope as pushed (or as last retried)
    expired: bool
    task: str  # the task hash's own name, queue and claim: for a copy that cannot be read
    queue: str
    idem_key: str | None
    waited_ms: int | None = None  # it had waited parked, handed a slot (G14)


def _parse(ids: list[str], replies: list[Any]) -> list[_Taken]:
    """The leased tasks; a task parked by this call is told (``TaskParked``) here, once
    per reply: a replayed call answers as the first did."""
    taken = []
    for task_id, reply in zip(ids, replies, strict=True):
        if int(reply[0]) == 1:
            name, queue, idem = str(reply[4]), str(reply[5]), str(reply[6])
            waited = str(reply[7]) if len(reply) > 7 else ""
            taken.append(_Taken(task_id, int(reply[1]), str(reply[2]), int(reply[3]) == 1,
                                name, queue, idem or None,
                                int(waited) if waited else None))  # fmt: skip
        elif str(reply[1]) == "parked" and len(reply) > 4:
            events.emit(events.TaskParked(task_id, str(reply[2]), str(reply[3]), str(reply[4])))
    return taken


class Dispatcher:
    """Dispatches the due scheduled tasks; run by the scanner that holds the lease."""

    def __init__(self, app: Any, config: Config, scanner_id: str) -> None:
        self.app = app
        self.config = config
        self.scanner_id = scanner_id
        self.keys = KeySpace.of(config)
        self.clock = ServerClock(lambda: self.client)
        self._earliest: float | None = None  # the earliest due time read last, ms
        self._earliest_read_at: float | None = None  # when (monotonic); None: read again

    @property
    def client(self) -> redis.Redis:
        return sync_client(self.config)

    def now_ms(self) -> int:
        """The Redis clock, epoch ms (read with ``TIME`` once every few seconds)."""
        return self.clock.now_ms()

    def due_ids(self, part: KeySpace, now_ms: int) -> list[str]:
        due = self.client.zrangebyscore(part.schedule, "-inf", now_ms, 0, BATCH)
        return [str(task_id) for task_id in due]

    def run_due(self) -> int:
        """Dispatch every task due now, partition by partition (only those whose
        earliest task is due: one round trip finds them); returns how many were
        published."""
        now_ms, heads = self._heads()
        due = [part for part, head in zip(self.keys.parts(), heads, strict=True)
               if head is not None and head <= now_ms]  # fmt: skip
        try:
            return sum(self._run_due(part, now_ms) for part in due)
        finally:
            if due:
                self._earliest_read_at = None  # the heads moved: read them again

    def _heads(self, timed: bool = True) -> tuple[int, list[float | None]]:
        """The Redis time (ms) and each partition's earliest due time, in one round
        trip (two on a cluster, whose pipelines refuse TIME); the earliest of them kept
        for :meth:`next_due_in_s`. ``timed=False``: the time is :attr:`clock`'s,
        enough to decide how long to wait; a dispatch reads the server's, so that a
        task made due now (a slot's hand-over) is due to it, never a millisecond
        early on a clock that lags."""
        sent_at = time.monotonic()
        pipe = timed_pipeline(self.client) if timed else self.client.pipeline(transaction=False)
        for part in self.keys.parts():
            pipe.zrange(part.schedule, 0, 0, withscores=True)
        if timed:
            now_ms, replies = execute_timed(self.client, pipe)
            self.clock.calibrate_ms(now_ms, sent_at)
        else:
            replies, now_ms = pipe.execute(), self.now_ms()
        heads = [float(head[0][1]) if head else None for head in replies]
        self._earliest = min((h for h in heads if h is not None), default=None)
        self._earliest_read_at = time.monotonic()
        return now_ms, heads

    def _run_due(self, part: KeySpace, now_ms: int) -> int:
        published = 0
        while ids := self.due_ids(part, now_ms):
            token = uuid.uuid4().hex
            lease_ms = int(self.config.resurrect_lease_s * 1000)
            taken = scripts.ScriptCall(
                scripts.SCHEDULE_TAKE, part.for_schedule_take(ids),
                [lease_ms, token, *ids], lambda replies: _parse(ids, replies),
            ).run(self.client)  # fmt: skip
            sent = [t for t in taken if self._dispatch(t)]
            if sent:
                grace_ms = int(self.config.queued_grace_s * 1000)
                args: list[scripts.Arg] = [grace_ms, token]
                for t in sent:
                    args += (t.task_id, t.fence)
                scripts.ScriptCall(
                    scripts.SCHEDULE_SENT, part.for_schedule_sent([t.task_id for t in sent]),
                    args, int,
                ).run(self.client)  # fmt: skip
            published += len(sent)
            if len(ids) < BATCH:
                break
        return published

    def next_due_in_s(self) -> float | None:
        """Seconds until the earliest scheduled task is due (0 if overdue), or None.

        The earliest due time is read again only after a wake-up (:meth:`wait`), a
        dispatch, or ``HEAD_FRESH_S``: between, no new earliest one can have come
        unseen, since every other writer of one rings the wake-up list (``push.lua``,
        ``retry.lua``, a freed slot's hand-over in ``_limits.lua``), the leader alone
        waits on it, and what the leader's own dispatch puts back (a rate's later
        turn) it reads after dispatching."""
        read_at = self._earliest_read_at
        if read_at is None or time.monotonic() - read_at >= HEAD_FRESH_S:
            self._heads(timed=False)
        if self._earliest is None:
            return None
        return max(0.0, (self._earliest - self.now_ms()) / 1000)

    def forget(self) -> None:
        """Read the earliest due time afresh next time (this scanner just took the
        lease: the rings before were another's)."""
        self._earliest_read_at = None

    def wait(self, timeout_s: float) -> None:
        """Sleep up to ``timeout_s``, or until a push makes a new earliest due time. On
        a Redis Cluster, whose BLPOP waits on one slot's lists only, the wait is cut
        into naps of ``CLUSTER_NAP_S``: a new earliest due time is seen within one."""
        if timeout_s <= 0:
            return
        if self.config.cluster:
            time.sleep(min(timeout_s, CLUSTER_NAP_S))
            self._earliest_read_at = None  # no wake-up list here: read at each nap
            return
        rung = self.client.blpop([part.schedule_wake for part in self.keys.parts()],
                                 timeout=timeout_s)  # fmt: skip
        if rung is not None:
            self._earliest_read_at = None

    def _dispatch(self, taken: _Taken) -> bool:
        try:
            env = decode(taken.stored, self.config.signer)
        except EnvelopeError as exc:
            self._dead(taken, None, Failure(
                Reason(exc.reason), type(exc).__name__,
                f"the stored copy of the task cannot be read: {exc}", worker=self.scanner_id,
            ), raw=taken.stored)  # fmt: skip
            return False
        env = dataclasses.replace(env, fence=taken.fence)
        if taken.expired:
            failure = Failure(
                Reason.EXPIRED, None, "its expiry passed before it was due",
                worker=self.scanner_id,
            )  # fmt: skip
            self._dead(taken, env, failure)
            return False
        try:
            publish.send(self.app, env, env.encode(self.config.signer))
        except Exception:
            # Leased and covered by the expiry index: the resurrector re-dispatches it
            # once the lease runs out.
            logger.error("scheduled publish failed task_id=%s", env.id, exc_info=True)
            return False
        logger.debug("dispatched scheduled task_id=%s task=%s", env.id, env.task)
        if taken.waited_ms is not None:
            events.emit(events.TaskUnparked(env.id, env.task, env.queue, taken.waited_ms / 1000))
        return True

    def _dead(
        self, taken: _Taken, env: Envelope | None, failure: Failure, raw: object = None
    ) -> None:
        ttl_ms = int(self.config.result_ttl_s * 1000)
        if env is not None:
            call = dlq.dead_letter(
                self.keys, failure, ttl_ms, env=env, signer=self.config.signer, held="queued"
            )
        else:
            stored = dlq.StoredTask(
                taken.task_id, taken.fence, taken.task, taken.queue, taken.idem_key
            )
            call = dlq.dead_letter(
                self.keys, failure, ttl_ms, env=None, raw=raw, stored=stored, held="queued"
            )
        if call.run(self.client).accepted:
            logger.error("dead-lettered task_id=%s reason=%s", taken.task_id, failure.reason)
