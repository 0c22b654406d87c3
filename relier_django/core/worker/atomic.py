"""How an ``@rl_task(atomic=...)`` body runs: inside its database's transaction, with
the fenced inbox's row (the Django layer's ``relier_django.inbox`` installs it; the
core never sees a database).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .context import TaskContext

AtomicRunner = Callable[[str, TaskContext, Callable[[], Any]], Any]
"""``runner(alias, ctx, body)``: run ``body()`` in a transaction on ``alias`` with the
inbox row of ``ctx``'s task, and return its result, or the result an earlier
incarnation recorded (then ``body`` is not called)."""

_lock = threading.Lock()
_runner: AtomicRunner | None = None


def install(runner: AtomicRunner | None) -> None:
    global _runner
    with _lock:
        _runner = runner


def body(alias: str | None, ctx: TaskContext, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, or ``fn`` run as one unit of the inbox when ``alias`` is set."""
    if alias is None:
        return fn
    runner = _runner
    if runner is None:
        raise RuntimeError(
            f"{ctx.task_name}: atomic= needs relier_django's inbox: add 'relier_django' to "
            "INSTALLED_APPS"
        )

    def unit(*args: Any, **kwargs: Any) -> Any:
        return runner(alias, ctx, lambda: fn(*args, **kwargs))

    return unit
