"""The context a task may declare as its first parameter."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..model.errors import TaskLost


@dataclass(slots=True)
class TaskContext:
    """What a running incarnation knows about itself.

    Attributes:
        task_id: stable across retries and resurrections.
        fence_token: grows with every incarnation; fence your own writes with it.
        attempt: 1 for the first execution, +1 per retry.
        resurrections: how many times the task was re-dispatched after a worker died.
        task_name: the task's full dotted name.
        worker: ``hostname:pid`` of the process running this incarnation.
        scheduled_at: when the task was due, timezone-aware (UTC): a countdown's or an
            eta's due time, a periodic tick's time; ``None`` for a task pushed to run now.
    """

    task_id: str
    fence_token: int
    attempt: int
    resurrections: int
    task_name: str
    worker: str
    scheduled_at: datetime | None = None
    # The task's identity (Envelope.identity): its id and its push's token, which a
    # later task given the same caller-chosen id does not share.
    identity: str = ""
    _lost: threading.Event = field(default_factory=threading.Event, repr=False)
    # Set by the runner: the latest checkpoint, and how to store a new one.
    _partial: Any = field(default=None, repr=False)
    _save: Callable[[Any], Awaitable[None]] | None = field(default=None, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    hard_timed_out: bool = field(default=False, repr=False)
    _inline: bool = field(default=False, repr=False)  # see inline()

    @classmethod
    def inline(cls, task_name: str, task_id: str | None = None, attempt: int = 1) -> TaskContext:
        """A context for the body called in this process (``task(...)``, ``run()``,
        ``apply()``, eager mode): never superseded, checkpoints kept in memory only."""
        ctx = cls(
            task_id or uuid.uuid4().hex, 0, 1, 0, task_name, f"{socket.gethostname()}:{os.getpid()}"
        )
        ctx._inline = True
        return ctx

    @property
    def idempotency_key(self) -> str:
        """A key that stays the same for every incarnation of this task (retries,
        resurrections, a zombie) and that no other task shares, not even one pushed
        later under the same caller-chosen id: pass it to an external API's
        idempotency header (a payment provider's ``Idempotency-Key``), so that a call
        repeated by a later incarnation is recognised there, and only that. Derive
        one per call for several calls: ``f"{ctx.idempotency_key}:refund"``.
        ``"relier-<task id>~<push token>"`` (``"relier-<task id>"`` for a task pushed
        by a release without push tokens)."""
        return f"relier-{self.identity or self.task_id}"

    def get_partial(self, default: Any = None) -> Any:
        """The latest checkpoint of this task, or ``default`` if it has none.

        A resurrected, retried or released incarnation starts with the checkpoint its
        predecessor saved last; reading it costs no round trip.
        """
        return default if self._partial is None else self._partial

    async def aset_partial(self, state: Any) -> None:
        """Save ``state`` (JSON) as this task's checkpoint, for ``async def`` tasks.

        Stored with the task before this returns. Only the current incarnation can
        save: a superseded one gets ``TaskLost``.

        Raises:
            TypeError: ``state`` is not JSON-serialisable.
            CheckpointTooLarge: over CHECKPOINT_MAX_BYTES with no CHECKPOINT_DIR.
            TaskLost: this incarnation was superseded.
        """
        if self._inline:
            self._partial = _checked(state)
            return
        if self._save is None:
            raise RuntimeError("this TaskContext is not attached to a running incarnation")
        await self._save(state)
        self._partial = state

    def set_partial(self, state: Any) -> None:
        """The same as ``aset_partial``, for plain ``def`` tasks (off the event loop)."""
        if self._inline:
            self._partial = _checked(state)
            return
        loop = self._loop
        if loop is None:
            raise RuntimeError("this TaskContext is not attached to a running incarnation")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError("inside an async def task, use `await ctx.aset_partial(state)`")
        asyncio.run_coroutine_threadsafe(self.aset_partial(state), loop).result()

    def is_current(self) -> bool:
        """False once this incarnation learned it was superseded (its fence moved).

        Learned at the next heartbeat refresh, so at most one refresh interval late;
        a superseded incarnation can never commit whatever this returns.
        """
        return not self._lost.is_set()

    def ensure_current(self) -> None:
        """Raise ``TaskLost`` if this incarnation was superseded: a cheap check for
        long-running plain ``def`` tasks, which cannot be cancelled from outside."""
        if self._lost.is_set():
            raise TaskLost(
                f"task {self.task_id}: incarnation with fence {self.fence_token} was superseded"
            )

    def mark_lost(self) -> None:
        self._lost.set()


def _checked(state: Any) -> Any:
    # What a stored checkpoint would refuse, an inline one refuses too.
    json.dumps(state, allow_nan=False)
    return state
