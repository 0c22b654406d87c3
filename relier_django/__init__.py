"""relier_django: Celery tasks that cannot be lost.

Public API::

    from relier_django import rl_task, TaskContext, Receipt, TaskFailed, lock
    from relier_django import result, aresult  # a receipt for a task id pushed elsewhere
    from relier_django import cancel, acancel  # take a task back, or fence off its run
    from relier_django import workflow  # a chain's, group's or chord's state, by its id

Celery's result backend over relier's store: ``relier_django.results:RelierBackend``.
"""

from .core.extras.lock import Lock, lock
from .core.model import config as _config
from .core.model.errors import (
    AdmissionRejected,
    ArgumentsTooLarge,
    CheckpointTooLarge,
    DuplicateTaskId,
    InvalidTaskId,
    LockLost,
    LockNotAcquired,
    ProgressTooLarge,
    PushFailed,
    RelierError,
    TaskCancelled,
    TaskFailed,
    TaskLost,
    TaskSuperseded,
)
from .core.store import cancel as _cancel
from .core.store import workflows as _workflows
from .core.store.cancel import Cancelled
from .core.store.receipt import DispatchState, NotDispatched, Receipt, aresult, result
from .core.store.workflows import WorkflowView
from .core.task import RelierTask, rl_task
from .core.worker.context import TaskContext

__all__ = [
    "AdmissionRejected",
    "ArgumentsTooLarge",
    "Cancelled",
    "CheckpointTooLarge",
    "DispatchState",
    "DuplicateTaskId",
    "InvalidTaskId",
    "Lock",
    "LockLost",
    "LockNotAcquired",
    "NotDispatched",
    "ProgressTooLarge",
    "PushFailed",
    "Receipt",
    "RelierError",
    "RelierTask",
    "TaskCancelled",
    "TaskContext",
    "TaskFailed",
    "TaskLost",
    "TaskSuperseded",
    "WorkflowView",
    "acancel",
    "aresult",
    "cancel",
    "lock",
    "result",
    "rl_task",
    "workflow",
]
__version__ = "0.1.0.dev0"


def cancel(task_id: str) -> Cancelled:
    """Cancel a task by id: removed if it has not started (scheduled, queued), fenced
    off if it is running (its commit is refused; an ``async def`` task is cancelled at
    its next heartbeat). Its receipts' ``get()`` then raise ``TaskCancelled`` and
    Celery's state is ``REVOKED``. A finished task is left as it is (``NOTHING``)."""
    return _cancel.cancel(_config.current(), task_id)


async def acancel(task_id: str) -> Cancelled:
    """Async twin of :func:`cancel`."""
    return await _cancel.acancel(_config.current(), task_id)


def workflow(workflow_id: str) -> WorkflowView | None:
    """A workflow's state by its id: a chain's first step's id (``chain(...)
    .apply_async()``'s result: follow ``.parent`` to the first), a group's or a
    chord's group id (``result.id`` of a group, ``result.parent.id`` of a chord).
    Each task with its Celery state; ``done``, ``pending``, ``failed`` and ``state``.
    None when no record is kept (never a workflow, or older than 7 days)."""
    return _workflows.read(_config.current(), workflow_id)
