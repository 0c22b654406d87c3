"""Coverage of messages a worker received but has not started (prefetched/reserved).

Celery's main process holds up to ``prefetch_multiplier * concurrency`` messages
(and every ETA/countdown message) before a pool process starts them. If the worker
dies, kombu's Redis transport gives them back only after the visibility timeout (an
hour by default). Instead, the main process heartbeats them like running tasks
(``heartbeat.lua`` in ``queued`` mode): each is registered as it arrives and
refreshed with the rest in one round trip per interval; once a task starts, its pool
process's heartbeat takes over and the main process drops it. A dead worker's
reserved tasks thus expire within one TTL and are resurrected; the broker's own copy,
redelivered later, carries an old fence and is refused by ``start.lua``.

Coverage ends as soon as a pool process *accepts* the message (Celery acks it then),
not when Celery forgets the request. Celery can keep an accepted request in its books
without running or failing it: the prefork pool drops, unsent, a job it had put back
for another process once the dead process's late acceptance marks it accepted. A
chaos run (a pool process SIGKILLed under load) lost a task that way while this
module covered every request Celery held: acked, never started, its deadline
refreshed for ever. From acceptance on, the deadline is the pool process's to keep:
it starts the task within moments, or the task expires and is resurrected.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable

from ..model.config import Config
from ..store import liveness, scripts
from ..store.connection import sync_client
from ..store.keys import KeySpace
from . import fencing, intake

logger = logging.getLogger("relier_django.reservations")


def fence_of(args: object) -> int | None:
    """The fence carried by a Celery message's positional arguments when they are one
    ``@rl_task`` envelope; None for anything else (other tasks, malformed calls)."""
    if not (isinstance(args, list | tuple) and len(args) == 1 and isinstance(args[0], str)):
        return None
    if '"sha256"' not in args[0]:  # cheap pre-filter before parsing
        return None
    try:
        body = json.loads(args[0])
    except ValueError:
        return None
    fence = body.get("fence") if isinstance(body, dict) else None
    return fence if isinstance(fence, int) else None


def waiting_request_ids() -> set[str]:
    """Ids of the requests this worker process holds (``celery.worker.state.requests``)
    that no pool process has accepted yet (``time_start`` is set on acceptance)."""
    from celery.worker import state

    for _ in range(3):  # the consumer thread may resize the dict while we copy it
        try:
            requests = list(state.requests.values())
            break
        except RuntimeError:
            continue
    else:
        requests = list(state.requests.copy().values())
    return {r.id for r in requests if getattr(r, "time_start", None) is None}


class Reservations:
    """The reserved tasks of one worker main process, kept alive from a thread."""

    def __init__(
        self,
        config: Config,
        waiting: Callable[[], set[str]] | None = None,
        worker: str = "",
    ) -> None:
        """``worker`` is this main process's id (``hostname:pid``): reserved tasks are
        marked as held by it, and the thread announces it alive (``presence.lua``, the
        live view's worker count). ``waiting`` returns the ids of the messages the
        worker holds that no pool process has accepted yet (see
        :func:`waiting_request_ids`). Any other held id stops being covered at the next
        refresh; one added since the previous refresh is kept for one more round, since
        Celery books a request only after the ``task_received`` signal that added it
        here."""
        self.config = config
        self.worker = worker
        self._waiting = waiting
        self.keys = KeySpace.of(config)
        self._held: dict[str, int] = {}
        self._fresh: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _refresh(self, held: list[tuple[str, int]]) -> list[str]:
        ttl_ms = int(self.config.heartbeat_ttl_s * 1000)
        call = fencing.heartbeat(self.keys, held, ttl_ms, state="queued", worker=self.worker)
        return call.run(sync_client(self.config))

    def announce(self, alive: bool) -> None:
        """Say this worker is alive for one heartbeat TTL (presence.lua), or leaving."""
        if not self.worker:
            return
        ttl_ms = int(self.config.heartbeat_ttl_s * 1000) if alive else 0
        args: list[scripts.Arg] = [self.worker, ttl_ms]
        scripts.ScriptCall(scripts.PRESENCE, self.keys.for_presence(), args, int).run(
            sync_client(self.config)
        )

    def add(self, task_id: str, fence: int) -> None:
        """Cover a just-received message now (one round trip, unless ``take.lua``
        already did as it took it: ``intake``), then with the rest.

        Synchronous on purpose: Celery sends ``task_received`` before it hands the
        message to the pool, and acks it (without ``acks_late``) as soon as a pool
        process accepts it. Registered here, the task has a TTL deadline before the
        broker forgets the message; registered later (batched in the reservation
        thread, as once tried), a worker killed between the ack and ``start.lua``
        would leave the task covered only by its hour-long queued grace."""
        with self._lock:
            # A broker redelivery of an older incarnation must not replace the current
            # one's entry (its refresh would fail and drop the current one's coverage).
            if fence < self._held.get(task_id, fence):
                return
            self._held[task_id] = fence
            self._fresh.add(task_id)
        if intake.takes_here():
            # take.lua marked it held by this process as it popped it: covered since
            # before it left its queue. (A copy it did not mark, stale or started
            # elsewhere, fails its first refresh and is dropped then.)
            return
        try:
            lost = self._refresh([(task_id, fence)])
        except Exception:
            logger.warning("could not register reserved task_id=%s", task_id, exc_info=True)
            return
        if lost:  # already started, superseded or finished: nothing to cover
            self._drop((task_id, fence) for task_id in lost)

    def _drop(self, pairs: Iterable[tuple[str, int]]) -> None:
        """Stop covering each ``(task_id, fence)``, unless a newer fence of that task
        was registered meanwhile."""
        with self._lock:
            for task_id, fence in pairs:
                if self._held.get(task_id) == fence:
                    del self._held[task_id]

    def held(self) -> list[tuple[str, int]]:
        with self._lock:
            return list(self._held.items())

    def refresh_once(self) -> None:
        self.announce(alive=True)
        with self._lock:
            held = list(self._held.items())
            fresh, self._fresh = self._fresh, set()
        if self._waiting is not None and held:
            waiting = self._waiting() | fresh
            self._drop(pair for pair in held if pair[0] not in waiting)
            held = [pair for pair in held if pair[0] in waiting]
        if held:
            lost = set(self._refresh(held))
            self._drop(pair for pair in held if pair[0] in lost)

    def handoff(self) -> int:
        """Give every reserved task up for immediate resurrection (warm shutdown)."""
        self.stop()
        try:
            if self.worker:
                liveness.leave(self.config, self.worker)
            self.announce(alive=False)
        except Exception:  # the live view only: its entry lapses after one TTL
            logger.warning("could not remove worker=%s from the live workers", self.worker)
        held = self.held()
        if not held:
            return 0
        self._drop(held)
        call = fencing.handoff(self.keys, held, state="queued", cause="drain")
        return call.run(sync_client(self.config))

    def run(self) -> None:
        try:  # alive from the start, not one interval later
            self.announce(alive=True)
        except Exception:
            logger.warning("could not announce worker=%s", self.worker, exc_info=True)
        while not self._stop.wait(self.config.heartbeat_every_s):
            try:
                self.refresh_once()
            except Exception:
                logger.warning("reserved-task refresh failed", exc_info=True)

    def start_thread(self) -> None:
        if self.worker:  # the tasks this process prefetches are held under its name
            liveness.hold(self.config, self.worker)
        self._thread = threading.Thread(target=self.run, name="relier-reservations", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
