"""Heartbeats for every task running in this process, refreshed from the bridge loop.

One round trip (heartbeat.lua) refreshes all of the process's tasks. A refresh that
finds a task's fence moved marks that incarnation lost (G2): its context reports
``is_current() == False`` and an ``async def`` task is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from . import fencing
from .config import Config
from .connection import async_client
from .keys import KeySpace

logger = logging.getLogger("relier_django.heartbeat")


@dataclass(slots=True)
class _Held:
    fence: int
    on_lost: Callable[[], None]


class Heartbeats:
    """The running tasks of one process (lives on its bridge loop)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._held: dict[str, _Held] = {}
        self._pump: asyncio.Task[None] | None = None

    def add(self, task_id: str, fence: int, on_lost: Callable[[], None]) -> None:
        self._held[task_id] = _Held(fence, on_lost)
        if self._pump is None or self._pump.done():
            self._pump = asyncio.get_running_loop().create_task(
                self._run(), name="relier-heartbeats"
            )

    def remove(self, task_id: str) -> None:
        self._held.pop(task_id, None)

    def held(self) -> list[tuple[str, int]]:
        return [(task_id, h.fence) for task_id, h in self._held.items()]

    async def refresh_once(self) -> list[str]:
        """Refresh every held task; returns (and signals) the ones that were lost."""
        held = self.held()
        if not held:
            return []
        keys = KeySpace(self.config.key_prefix)
        ttl_ms = int(self.config.heartbeat_ttl_s * 1000)
        lost = await fencing.heartbeat(keys, held, ttl_ms).arun(async_client(self.config))
        for task_id in lost:
            entry = self._held.pop(task_id, None)
            if entry is not None:
                logger.warning(
                    "incarnation superseded task_id=%s fence=%s: cancelling it",
                    task_id,
                    entry.fence,
                )
                entry.on_lost()
        return lost

    async def _run(self) -> None:
        while self._held:
            await asyncio.sleep(self.config.heartbeat_every_s)
            try:
                await self.refresh_once()
            except Exception:
                # The deadline keeps its old value; if Redis stays away long enough the
                # task is resurrected elsewhere and this incarnation will be refused.
                logger.warning("heartbeat refresh failed", exc_info=True)


_by_loop: dict[int, Heartbeats] = {}


def for_running_loop(config: Config) -> Heartbeats:
    """The heartbeats of the running (bridge) loop."""
    loop_id = id(asyncio.get_running_loop())
    hb = _by_loop.get(loop_id)
    if hb is None or hb.config != config:
        hb = _by_loop[loop_id] = Heartbeats(config)
    return hb
