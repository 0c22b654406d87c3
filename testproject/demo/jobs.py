"""Example tasks declared with Django's own ``@task`` (``django.tasks``), run by the
``relier_django.tasks.RelierBackend`` of ``TASKS`` on the same Celery workers as the
``@rl_task`` ones (``CELERY_IMPORTS`` makes every worker import this module).

Each task records its runs in Redis as the demo tasks do (``demo:exec:<label>``, one
entry per run), so a test counts runs independently of results. Django's
``task_enqueued``, ``task_started`` and ``task_finished`` are logged, one JSON line per
signal, to the file ``DEMO_SIGNAL_LOG`` names (nothing when it is unset).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from django.dispatch import receiver

from testproject.demo.tasks import _mark_start, _redis

try:
    from django.tasks import task
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task
    from django_tasks.signals import task_enqueued, task_finished, task_started


@task()
def add(a: int, b: int) -> int:
    """The smallest task: its return value is read back from the store."""
    return a + b


@task()
def in_order(line: str, label: str) -> str:
    """Appends ``label`` to ``demo:order:<line>``: the order a backlog ran in."""
    _redis().rpush(f"demo:order:{line}", label)
    return label


@task()
def pair(label: str) -> tuple[str, int]:
    """Returns a tuple, which Django keeps as a list."""
    _redis().rpush(f"demo:exec:{label}", "1")
    return (label, os.getpid())


@task(takes_context=True)
def whoami(context: Any, label: str) -> dict:
    """What Django's TaskContext tells the task."""
    _redis().rpush(f"demo:exec:{label}", str(context.attempt))
    result = context.task_result
    return {"id": result.id, "attempt": context.attempt, "workers": list(result.worker_ids)}


@task()
async def double(x: int) -> int:
    """An async task, on the worker's event loop."""
    await asyncio.sleep(0.01)
    return 2 * x


@task()
def explode(label: str) -> None:
    """Fails: the DLQ, and a FAILED TaskResult with the error."""
    _redis().rpush(f"demo:exec:{label}", "1")
    raise ValueError(f"boom {label}")


@task()
def slow(label: str, sleep_s: float) -> str:
    """Records its start (time, pid), sleeps, records its run: for kills."""
    runs = int(_redis().llen(f"demo:start:{label}")) + 1
    _mark_start(label, runs)
    time.sleep(sleep_s)
    _redis().rpush(f"demo:exec:{label}", str(runs))
    return label


@task()
def until_fixed(label: str) -> str:
    """Fails until ``demo:fixed:<label>`` is set: released from the DLQ, it succeeds."""
    _redis().rpush(f"demo:exec:{label}", "1")
    if not _redis().get(f"demo:fixed:{label}"):
        raise RuntimeError(f"{label} is not fixed yet")
    return "fixed"


@task(idempotent=True, max_retries=2, retry_on=(TimeoutError,), retry_backoff=0.05)
def charge(order_id: str, failures: int = 0) -> dict:
    """Relier's options through @task(...): idempotent, and retried on TimeoutError."""
    runs = int(_redis().rpush(f"demo:exec:{order_id}", "1"))
    if runs <= failures:
        raise TimeoutError(f"attempt {runs} timed out")
    return {"order": order_id, "runs": runs}


def _span(key: str, label: str, sleep_s: float) -> str:
    """Records its start and end on the Redis clock in ``demo:lim:dj`` as
    testproject/demo/limit_tasks.py's tasks do (fence 0: a Django task sees none)."""
    client = _redis()
    for kind in ("start", "end"):
        if kind == "end":
            time.sleep(sleep_s)
        seconds, micros = client.time()
        ms = int(seconds) * 1000 + int(micros) // 1000
        client.rpush("demo:lim:dj", f"{kind}:{key}:{label}:0:{ms}:{os.getpid()}")
    return label


@task(concurrency=1, concurrency_key="key")
def one_per_key(key: str, label: str, sleep_s: float = 0.0) -> str:
    """Flow control through @task(...): one at a time per key."""
    return _span(key, label, sleep_s)


@task()
def unlimited(key: str, label: str, sleep_s: float = 0.0) -> str:
    """No flow control of its own: ``using(limit=..., concurrency_key=...)`` gives one."""
    return _span(key, label, sleep_s)


_SIGNALS = {task_enqueued: "task_enqueued", task_started: "task_started",
            task_finished: "task_finished"}  # fmt: skip


@receiver(list(_SIGNALS), dispatch_uid="demo.jobs")
def _log(sender: Any, signal: Any, task_result: Any, **_: Any) -> None:
    path = os.environ.get("DEMO_SIGNAL_LOG")
    if not path:
        return
    line = json.dumps({
        "signal": _SIGNALS[signal], "pid": os.getpid(), "id": task_result.id,
        "status": str(task_result.status), "task": task_result.task.module_path,
    })  # fmt: skip
    with open(path, "a") as fh:
        fh.write(line + "\n")
