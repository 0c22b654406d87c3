"""The context a task may declare as its first parameter."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from .errors import TaskLost


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
    """

    task_id: str
    fence_token: int
    attempt: int
    resurrections: int
    task_name: str
    worker: str
    _lost: threading.Event = field(default_factory=threading.Event, repr=False)

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
