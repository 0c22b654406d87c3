"""relier_django: Celery tasks that cannot be lost.

Public API::

    from relier_django import rl_task, TaskContext, Receipt, TaskFailed
"""

from .core.context import TaskContext
from .core.errors import DuplicateTaskId, RelierError, TaskFailed, TaskLost
from .core.receipt import Receipt
from .core.task import RelierTask, rl_task

__all__ = [
    "DuplicateTaskId",
    "Receipt",
    "RelierError",
    "RelierTask",
    "TaskContext",
    "TaskFailed",
    "TaskLost",
    "rl_task",
]
__version__ = "0.1.0.dev0"
