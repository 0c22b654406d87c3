"""What ``push``/``apush`` return: the task id, and a way to wait for the outcome."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from . import bridge, outcome
from .config import Config
from .connection import async_client, sync_client
from .keys import KeySpace

_FIRST_POLL_S = 0.002
_MAX_POLL_S = 0.1


@dataclass(frozen=True, slots=True)
class Receipt:
    """A pushed task.

    Attributes:
        task_id: the task's id; for an idempotent duplicate, the id of the task that
            holds the key, so every duplicate sees the same result.
        deduplicated: True when this push was an idempotent duplicate and sent nothing.
    """

    task_id: str
    deduplicated: bool
    config: Config

    @property
    def _key(self) -> str:
        return KeySpace(self.config.key_prefix).result(self.task_id)

    def get(self, timeout: float | None = None) -> Any:
        """Wait for the committed result.

        Raises:
            TaskFailed: the task is in the dead-letter queue (reason and error attached).
            TimeoutError: no outcome within ``timeout`` seconds (the task may still run).
            RuntimeError: called inside a running event loop; use ``await receipt.aget()``.
        """
        if bridge.in_running_loop():
            raise RuntimeError(
                "receipt.get() would block the running event loop; use await receipt.aget()"
            )
        client = sync_client(self.config)
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = _FIRST_POLL_S
        while True:
            record = client.get(self._key)
            if record is not None:
                return outcome.read(self.task_id, record)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"task {self.task_id}: no outcome within {timeout}s")
            time.sleep(pause)
            pause = min(pause * 2, _MAX_POLL_S)

    async def aget(self, timeout: float | None = None) -> Any:  # noqa: ASYNC109 - mirrors get()
        """Async twin of :meth:`get`."""
        client = async_client(self.config)
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = _FIRST_POLL_S
        while True:
            record = await client.get(self._key)
            if record is not None:
                return outcome.read(self.task_id, record)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"task {self.task_id}: no outcome within {timeout}s")
            await asyncio.sleep(pause)
            pause = min(pause * 2, _MAX_POLL_S)
