"""Time limits: relier's two tiers for ``async def`` tasks, Celery's for plain ``def``.

``async def``: at ``soft_timeout`` the task's ``on_soft_timeout(ctx)`` runs beside it (a
chance to save a checkpoint or to log); at ``hard_timeout`` the task is cancelled: it
gets ``CancelledError`` at its next ``await`` and its ``finally`` blocks run, then the
runner dead-letters it with reason ``hard_timeout``. No signals and no thread kills:
only a coroutine can be stopped safely at an await point. Both clocks start when the
incarnation starts, on this worker's monotonic clock; a new incarnation gets the full
time again.

Plain ``def``: a thread cannot be stopped safely, a process can. ``@rl_task`` hands the
limits to Celery (``soft_time_limit``/``time_limit``), whose prefork pool raises
``SoftTimeLimitExceeded`` inside the task at the soft limit and kills the pool process
at the hard one. A soft limit the task lets escape is dead-lettered by the runner
(``soft_limit_failure``); a kill is reported in the worker's main process
(``TimeLimitExceeded`` through ``task_failure``), where ``signals`` files the task it
stopped (``killed``). Either way reason ``hard_timeout``, never a resurrection: a task
that outlived its limit once would outlive it again.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import traceback
from dataclasses import dataclass, field
from typing import Any

from billiard.exceptions import SoftTimeLimitExceeded

from ..dlq import dead_letter as dlq
from ..model.envelope import Envelope
from ..model.failure import Failure, Reason
from ..model.signing import Signer
from ..model.spec import TaskSpec
from ..model.transition import Transition
from ..store.keys import KeySpace
from ..store.scripts import ScriptCall
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


def soft_limit_failure(spec: TaskSpec, error: BaseException | None, worker: str) -> Failure | None:
    """What the DLQ records for a plain ``def`` task that let Celery's soft time limit
    (``SoftTimeLimitExceeded``) escape; None for any other ending, and for a soft limit
    the task's ``retry_on`` covers (retried like any error it names)."""
    if not isinstance(error, SoftTimeLimitExceeded) or isinstance(error, spec.retry_on):
        return None
    return Failure(
        Reason.HARD_TIMEOUT,
        type(error).__name__,
        "ran past its soft time limit and let SoftTimeLimitExceeded escape (catch it in "
        "the task to save a checkpoint, then finish or raise)",
        "".join(traceback.format_exception(error)),
        worker=worker,
    )


def killed(
    keys: KeySpace,
    env: Envelope,
    limit_s: object,
    worker: str,
    result_ttl_ms: int,
    signer: Signer | None,
) -> ScriptCall[Transition]:
    """``dead_letter.lua`` for the incarnation ``env`` that Celery's hard time limit
    stopped (``limit_s``: the limit it reported), fenced to it and to the ``running``
    state: a task that committed, or that another incarnation took over, is left alone,
    and a second report of the same stop finds nothing to move. Its latest checkpoint
    and history go into the entry."""
    failure = Failure(
        Reason.HARD_TIMEOUT,
        "TimeLimitExceeded",
        f"ran longer than its hard time limit ({limit_s} s) and Celery stopped it",
        worker=worker,
    )
    return dlq.dead_letter(keys, failure, result_ttl_ms, env=env, signer=signer, held="running")
