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
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable

from . import fencing
from .config import Config
from .connection import sync_client
from .keys import KeySpace

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


class Reservations:
    """The reserved tasks of one worker main process, kept alive from a thread."""

    def __init__(self, config: Config, tracked: Callable[[], set[str]] | None = None) -> None:
        """``tracked`` returns the ids the worker itself still holds (Celery's
        ``worker.state.requests``): once the pool is done with a request, successfully
        or not, it stops being covered here and expires like any dead task."""
        self.config = config
        self._tracked = tracked
        self.keys = KeySpace(config.key_prefix)
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _refresh(self, held: list[tuple[str, int]]) -> list[str]:
        ttl_ms = int(self.config.heartbeat_ttl_s * 1000)
        call = fencing.heartbeat(self.keys, held, ttl_ms, state="queued")
        return call.run(sync_client(self.config))

    def add(self, task_id: str, fence: int) -> None:
        """Cover a just-received message now (one round trip), then with the rest."""
        with self._lock:
            self._held[task_id] = fence
        try:
            lost = self._refresh([(task_id, fence)])
        except Exception:
            logger.warning("could not register reserved task_id=%s", task_id, exc_info=True)
            return
        if lost:  # already started, superseded or finished: nothing to cover
            self._drop(lost)

    def _drop(self, ids: Iterable[str]) -> None:
        with self._lock:
            for task_id in ids:
                self._held.pop(task_id, None)

    def held(self) -> list[tuple[str, int]]:
        with self._lock:
            return list(self._held.items())

    def refresh_once(self) -> None:
        held = self.held()
        if self._tracked is not None and held:
            tracked = self._tracked()
            gone = [task_id for task_id, _ in held if task_id not in tracked]
            self._drop(gone)
            held = [pair for pair in held if pair[0] in tracked]
        if held:
            self._drop(self._refresh(held))

    def handoff(self) -> int:
        """Give every reserved task up for immediate resurrection (warm shutdown)."""
        self.stop()
        held = self.held()
        if not held:
            return 0
        self._drop(task_id for task_id, _ in held)
        call = fencing.handoff(self.keys, held, state="queued")
        return call.run(sync_client(self.config))

    def run(self) -> None:
        while not self._stop.wait(self.config.heartbeat_every_s):
            try:
                self.refresh_once()
            except Exception:
                logger.warning("reserved-task refresh failed", exc_info=True)

    def start_thread(self) -> None:
        self._thread = threading.Thread(target=self.run, name="relier-reservations", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
