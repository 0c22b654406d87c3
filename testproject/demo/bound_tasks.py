"""Bound tasks written in Celery's idioms (issue 39): ``self.request`` and
``raise self.retry(exc=..., countdown=...)``, for
tests/integration/celery_compat/test_bound_tasks.py on real workers and in eager mode.

Each run appends what it saw of ``self.request`` to ``demo:bound:<label>`` in Redis, so a
test counts runs and reads their requests independently of the outcome.
"""

from __future__ import annotations

import json
from typing import Any

from relier_django import rl_task
from relier_django.core.model import config
from relier_django.core.store.connection import sync_client


def _seen(self: Any, label: str) -> int:
    """Record this run's view of ``self.request``; returns how many runs ``label`` had."""
    request = self.request
    entry = {
        "id": request.id, "retries": request.retries, "args": list(request.args),
        "kwargs": dict(request.kwargs), "is_eager": request.is_eager, "task": request.task,
        "root_id": request.root_id, "fence": self.fence_token, "attempt": self.attempt,
        "eta": request.eta, "routing_key": request.delivery_info["routing_key"],
        "parent_id": request.parent_id, "expires": request.expires,
    }  # fmt: skip
    return int(sync_client(config.current()).rpush(f"demo:bound:{label}", json.dumps(entry)))


@rl_task(name="demo.bound.retrying", bind=True)
def retrying(self: Any, label: str, failures: int, *, note: str = "") -> dict[str, Any]:
    """Fails its first ``failures`` runs with ``raise self.retry(exc=..., countdown=1)``."""
    _seen(self, label)
    if self.request.retries < failures:
        try:
            raise ConnectionError(f"{label}: run {self.request.retries + 1} failed")
        except ConnectionError as exc:
            raise self.retry(exc=exc, countdown=1) from exc
    return {"retries": self.request.retries, "note": note, "fence": self.fence_token}


@rl_task(name="demo.bound.aretrying", bind=True)
async def aretrying(self: Any, label: str, failures: int, *, note: str = "") -> dict[str, Any]:
    """``retrying`` as an ``async def`` task."""
    _seen(self, label)
    if self.request.retries < failures:
        raise self.retry(exc=ConnectionError(f"{label}: failed"), countdown=1)
    return {"retries": self.request.retries, "note": note, "fence": self.fence_token}


@rl_task(name="demo.bound.hopeless", bind=True, max_retries=2)
def hopeless(self: Any, label: str) -> None:
    """Always retries, with an exception: its third run exhausts ``max_retries=2``."""
    _seen(self, label)
    raise self.retry(exc=TimeoutError(f"{label}: still down"), countdown=0.2)


@rl_task(name="demo.bound.hopeless_bare", bind=True, max_retries=1, default_retry_delay=0.2)
def hopeless_bare(self: Any, label: str) -> None:
    """Always retries without an exception, after ``default_retry_delay``: its second
    run raises ``MaxRetriesExceededError``."""
    _seen(self, label)
    raise self.retry()


@rl_task(name="demo.bound.quiet_retry", bind=True)
def quiet_retry(self: Any, label: str) -> str:
    """``self.retry(throw=False)`` on its first run, which then returns: retried all the
    same; the second run's value is the one committed."""
    runs = _seen(self, label)
    if runs == 1:
        self.retry(countdown=0, throw=False)
        return "first run: not committed"
    return f"run {runs}"


@rl_task(name="demo.bound.hopeless_retry_on", bind=True, retry_on=(TimeoutError,), max_retries=3)
def hopeless_retry_on(self: Any, label: str) -> None:
    """``self.retry(exc=, max_retries=1)`` with an exception ``retry_on`` names: once
    the call's limit is used up, the exception is not retried again by ``retry_on``
    (whose limit, the task's, has retries left)."""
    _seen(self, label)
    raise self.retry(exc=TimeoutError(f"{label}: still down"), countdown=0.2, max_retries=1)


@rl_task(name="demo.bound.autoretry_kwargs", bind=True, autoretry_for=(KeyError,),
         max_retries=5, retry_kwargs={"max_retries": 1, "countdown": 0.2})  # fmt: skip
def autoretry_kwargs(self: Any, label: str) -> None:
    """Celery's ``retry_kwargs``: its ``max_retries`` bounds ``autoretry_for``."""
    _seen(self, label)
    raise KeyError(label)


@rl_task(name="demo.bound.lineage", bind=True)
def lineage(self: Any, previous: Any = None, *, label: str = "lineage") -> str:
    """Records its request (``parent_id``, ``expires``) and returns its id, so a chain of
    them hands each step the one before's id."""
    _seen(self, label)
    return str(self.request.id)


@rl_task(name="demo.bound.spawner", bind=True)
def spawner(self: Any, label: str) -> str:
    """Pushes ``lineage`` from its body; returns the pushed task's id."""
    return lineage.push(label=label).task_id
