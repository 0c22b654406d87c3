"""Heartbeats for every task running in this process, refreshed from the bridge loop.

One round trip (heartbeat.lua) refreshes all of the process's tasks. A refresh that
finds a task's fence moved marks that incarnation lost (G2): its context reports
``is_current() == False`` and an ``async def`` task is cancelled. Tasks are added and
removed from any thread (a plain ``def`` task runs in Celery's pool thread); the
refreshes always run on the loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..model.config import Config
from ..store.connection import async_client
from ..store.keys import KeySpace
from . import fencing

logger = logging.getLogger("relier_django.heartbeat")


@dataclass(slots=True)
class _Held:
    fence: int
    on_lost: Callable[[], None]


class Heartbeats:
    """The running tasks of one process, refreshed on its bridge loop."""

    def __init__(self, config: Config, loop: asyncio.AbstractEventLoop) -> None:
        self.config = config
        self._loop = loop
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()
        self._pumping = False  # a refresh task is scheduled or running
        self._pump: asyncio.Task[None] | None = None  # held: the loop keeps weak refs only

    def add(self, task_id: str, fence: int, on_lost: Callable[[], None]) -> None:
        """Cover ``task_id`` at ``fence`` from the next refresh on. Any thread; the
        loop is woken only when no refresh task is running yet. ``on_lost`` runs on
        the loop."""
        with self._lock:
            self._held[task_id] = _Held(fence, on_lost)
            if self._pumping:
                return
            self._pumping = True
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._start_pump()
        else:
            self._loop.call_soon_threadsafe(self._start_pump)

    def _start_pump(self) -> None:
        self._pump = self._loop.create_task(self._run(), name="relier-heartbeats")

    def remove(self, task_id: str, fence: int) -> None:
        """Stop covering ``task_id`` at ``fence``; a newer incarnation of the same task
        that started in this process meanwhile keeps its entry."""
        with self._lock:
            self._discard(task_id, fence)

    def _discard(self, task_id: str, fence: int) -> _Held | None:
        entry = self._held.get(task_id)
        if entry is None or entry.fence != fence:
            return None
        return self._held.pop(task_id)

    def held(self) -> list[tuple[str, int]]:
        with self._lock:
            return [(task_id, h.fence) for task_id, h in self._held.items()]

    async def refresh_once(self) -> list[str]:
        """Refresh every held task; returns (and signals) the ones that were lost."""
        held = self.held()
        if not held:
            return []
        keys = KeySpace.of(self.config)
        ttl_ms = int(self.config.heartbeat_ttl_s * 1000)
        lost = await fencing.heartbeat(keys, held, ttl_ms).arun(async_client(self.config))
        fences = dict(held)
        for task_id in lost:
            # The fence refreshed, not whatever is held now: a newer incarnation added
            # while the refresh was in flight is not the one that was lost.
            with self._lock:
                entry = self._discard(task_id, fences[task_id])
            if entry is not None:
                logger.warning(
                    "incarnation superseded task_id=%s fence=%s: cancelling it",
                    task_id,
                    entry.fence,
                )
                entry.on_lost()
        return lost

    async def _run(self) -> None:
        try:
            while True:
                await asyncio.sleep(self.config.heartbeat_every_s)
                try:
                    await self.refresh_once()
                except Exception:
                    # The deadline keeps its old value; if Redis stays away long enough
                    # the task is resurrected elsewhere and this incarnation is refused.
                    logger.warning("heartbeat refresh failed", exc_info=True)
                with self._lock:
                    if not self._held:  # an add() from now on starts a new pump
                        self._pumping = False
                        return
        except BaseException:
            with self._lock:
                self._pumping = False
            raise


_by_loop: dict[int, Heartbeats] = {}
_by_loop_lock = threading.Lock()


def for_loop(loop: asyncio.AbstractEventLoop, config: Config) -> Heartbeats:
    """The heartbeats refreshed on ``loop`` (this process's bridge loop); callable
    from any thread."""
    with _by_loop_lock:
        hb = _by_loop.get(id(loop))
        if hb is None or hb._loop is not loop or (hb.config is not config and hb.config != config):
            hb = _by_loop[id(loop)] = Heartbeats(config, loop)
        return hb


def for_running_loop(config: Config) -> Heartbeats:
    """The heartbeats of the running (bridge) loop."""
    return for_loop(asyncio.get_running_loop(), config)
