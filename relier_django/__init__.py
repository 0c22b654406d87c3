"""relier_django: Celery tasks that cannot be lost.

Public API::

    from relier_django import rl_task, TaskContext, Receipt, TaskFailed, lock
    from relier_django import result, aresult  # a receipt for a task id pushed elsewhere

Celery's result backend over relier's store: ``relier_django.results:RelierBackend``.
"""

from .core.extras.lock import Lock, lock
from .core.model.errors import (
    AdmissionRejected,
    CheckpointTooLarge,
    DuplicateTaskId,
    LockLost,
    LockNotAcquired,
    RelierError,
    TaskFailed,
    TaskLost,
)
from .core.store.receipt import DispatchState, NotDispatched, Receipt, aresult, result
from .core.task import RelierTask, rl_task
from .core.worker.context import TaskContext

__all__ = [
    "AdmissionRejected",
    "CheckpointTooLarge",
    "DispatchState",
    "DuplicateTaskId",
    "Lock",
    "LockLost",
    "LockNotAcquired",
    "NotDispatched",
    "Receipt",
    "RelierError",
    "RelierTask",
    "TaskContext",
    "TaskFailed",
    "TaskLost",
    "aresult",
    "lock",
    "result",
    "rl_task",
]
__version__ = "0.1.0.dev0"
