"""Two-tier timeouts for ``async def`` tasks: a soft hook, then a cooperative cancel.

At ``soft_timeout`` the task's ``on_soft_timeout(ctx)`` runs beside it (a chance to
save a checkpoint or to log); at ``hard_timeout`` the task is cancelled: it gets
``CancelledError`` at its next ``await`` and its ``finally`` blocks run, then the
runner dead-letters it with reason ``hard_timeout``. No signals and no thread kills:
only a coroutine can be stopped safely at an await point, which is why plain ``def``
tasks cannot have timeouts. Both clocks start when the incarnation starts, on this
worker's monotonic clock; a new incarnation gets the full time again.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from dataclasses import dataclass, field
from typing import Any

from ..model.failure import Failure, Reason
from ..model.spec import TaskSpec
from .context import TaskContext

logger = logging.getLogger("relier_django.timeouts")


@dataclass
class Timers:
    """The armed deadlines of one incarnation; ``cancel()`` once it is over."""

    handles: list[asyncio.TimerHandle] = field(default_factory=list)
    hooks: set[asyncio.Task[Any]] = field(default_factory=set)

    def cancel(self) -> None:
        for handle in self.handles:
            handle.cancel()
        for hook in self.hooks:  # a hook still running has nothing left to act on
            hook.cancel()


def arm(spec: TaskSpec, ctx: TaskContext, work: asyncio.Task[Any]) -> Timers:
    """Schedule the soft hook and the hard cancel of ``work`` on the running loop."""
    timers = Timers()
    loop = asyncio.get_running_loop()
    if spec.soft_timeout_s is not None:
        timers.handles.append(loop.call_later(spec.soft_timeout_s, _soft, spec, ctx, timers))
    if spec.hard_timeout_s is not None:
        timers.handles.append(loop.call_later(spec.hard_timeout_s, _hard, spec, ctx, work))
    return timers


def _soft(spec: TaskSpec, ctx: TaskContext, timers: Timers) -> None:
    logger.warning(
        "soft timeout task_id=%s fence=%s after %ss", ctx.task_id, ctx.fence_token,
        spec.soft_timeout_s,
    )  # fmt: skip
    hook = spec.on_soft_timeout
    if hook is None:
        return
    call = hook(ctx) if inspect.iscoroutinefunction(hook) else asyncio.to_thread(hook, ctx)
    task = asyncio.get_running_loop().create_task(_guarded(call, ctx))
    timers.hooks.add(task)
    task.add_done_callback(timers.hooks.discard)


async def _guarded(call: Any, ctx: TaskContext) -> None:
    try:
        await call
    except asyncio.CancelledError:
        raise
    except BaseException:  # the hook's failure is reported, never the task's
        logger.error("on_soft_timeout failed task_id=%s", ctx.task_id, exc_info=True)


def _hard(spec: TaskSpec, ctx: TaskContext, work: asyncio.Task[Any]) -> None:
    if work.done():
        return
    ctx.hard_timed_out = True
    logger.error(
        "hard timeout task_id=%s fence=%s after %ss: cancelling", ctx.task_id, ctx.fence_token,
        spec.hard_timeout_s,
    )  # fmt: skip
    work.cancel()


def failure(spec: TaskSpec, worker: str) -> Failure:
    """What the DLQ records for a task stopped at its hard timeout."""
    return Failure(
        Reason.HARD_TIMEOUT,
        "HardTimeout",
        f"ran longer than hard_timeout ({spec.hard_timeout_s} s) and was cancelled",
        worker=worker,
    )
