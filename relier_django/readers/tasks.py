"""One task read by its id, wired to the settings: what the admin's task page, the
``relier_dlq`` command and the overview show of a task.

Two readings of the same task's keys, for two questions: :func:`unfinished` (its hash
and history, while it is in flight) and :func:`outcome` (where it stands as its
receipt would say, whether in flight, finished, dead-lettered or cancelled).
"""

from __future__ import annotations

from .. import conf
from ..core.observe.task import TaskView, read_task
from ..core.store.connection import sync_client
from ..core.store.keys import KeySpace
from ..core.store.receipt import TaskStatus, read_status


def unfinished(task_id: str) -> TaskView | None:
    """The task ``task_id`` as the store holds it now (state, fence, history), or None
    once it has finished (committed, dead-lettered, cancelled) or was never pushed."""
    cfg = conf.get_config()
    return read_task(sync_client(cfg), KeySpace.of(cfg), task_id)


def outcome(task_id: str) -> TaskStatus:
    """Where a task stands as its receipt would say (``SUCCESS``, ``FAILURE``,
    ``REVOKED``... or ``known=False``)."""
    return read_status(conf.get_config(), task_id)
