"""Tasks for tests/integration/django_app/test_django_tasks_conformance.py (Django's own
tests/tasks expectations, adapted to a real backend).

Each is the smallest function that shows one behaviour Django's test suite expects
of a backend (``tests/tasks/tasks.py`` has their counterparts); workers import this
module through ``CELERY_IMPORTS``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task


@task()
def noop(*args: Any, **kwargs: Any) -> None:
    """Returns None: SUCCESSFUL with ``return_value`` None, not "not finished"."""
    return None


@task()
async def anoop(*args: Any, **kwargs: Any) -> None:
    """The async twin of :func:`noop`."""
    return None


@task()
def meaning() -> int:
    """A value to read back, and a second task whose ids ``noop`` must refuse."""
    return 42


@task()
def fail_value_error() -> None:
    """An ordinary exception: FAILED, with its class path and traceback."""
    raise ValueError("conformance failed with a ValueError")


@task()
def fail_complex_exception() -> None:
    """An exception whose argument is itself an exception."""
    raise ValueError(ValueError("conformance failed with a nested ValueError"))


# max_resurrections=0: a process that leaves with SystemExit looks like a dead worker
# to the pool; without the limit the test would wait for every resurrection.
@task(max_resurrections=0)
def fail_system_exit() -> None:
    """A BaseException that is not an Exception (Django records it as the failure)."""
    raise SystemExit("conformance failed with a SystemExit")


@task()
def complex_return() -> object:
    """A return value JSON cannot carry: Django fails the task with a TypeError."""
    return object()


@task()
def normalised_return() -> dict[str, Any]:
    """Values ``normalize_json`` changes: a tuple becomes a list, bytes a str."""
    return {"tuple": (1, (2, 3)), "bytes": b"text", "none": None}


@task(takes_context=True)
async def context_seen(context: Any, label: str) -> dict[str, Any]:
    """What an ``async def`` task taking Django's ``TaskContext`` is told."""
    await asyncio.sleep(0)
    result = context.task_result
    return {
        "label": label,
        "id": result.id,
        "attempt": context.attempt,
        "status": str(result.status),
        "args": result.args,
    }


@task()
def sleeper(seconds: float) -> float:
    """Runs long enough to be seen RUNNING."""
    time.sleep(seconds)
    return seconds
