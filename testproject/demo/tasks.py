"""Example tasks used by the tests, the chaos runner and the demo.

Each relier task records every execution in Redis (``demo:exec:<label>``: one entry
per run, with its fence), so a test can count runs independently of commits.
"""

from __future__ import annotations

import asyncio
import json
import time

import redis
from celery import shared_task
from django.conf import settings

from relier_django import TaskContext, rl_task


def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.RELIER_REDIS_URL, decode_responses=True)


def _record(label: str, ctx: TaskContext | None = None) -> int:
    """Append one execution record; returns how many times ``label`` has run."""
    entry = f"{ctx.fence_token}:{ctx.worker}" if ctx else "-"
    return int(_redis().rpush(f"demo:exec:{label}", entry))


@shared_task(name="demo.plain_record")
def plain_record(label: str, sleep_s: float = 0.0) -> str:
    """A vanilla Celery task: records each execution, so a test can count runs."""
    if sleep_s:
        time.sleep(sleep_s)
    _redis().incr(f"demo:plain:{label}")
    return label


# The demo tasks talk to Redis themselves, so a Redis restart can fail them: retried.
@rl_task(name="demo.record", retry_on=(redis.exceptions.ConnectionError,), retry_backoff=0.2)
async def record(ctx: TaskContext, label: str, sleep_s: float = 0.0) -> dict:
    """An async task: sleeps, records its run, returns who ran it."""
    if sleep_s:
        await asyncio.sleep(sleep_s)
    runs = _record(label, ctx)
    return {"label": label, "fence": ctx.fence_token, "runs": runs}


@rl_task(name="demo.sync_record")
def sync_record(ctx: TaskContext, label: str, sleep_s: float = 0.0) -> dict:
    """The same as ``record``, as a plain ``def`` (runs in a thread)."""
    if sleep_s:
        time.sleep(sleep_s)
    runs = _record(label, ctx)
    return {"label": label, "fence": ctx.fence_token, "runs": runs}


@rl_task(name="demo.charge", idempotent=True)
def charge(ctx: TaskContext, order_id: str, amount: int, sleep_s: float = 0.0) -> dict:
    """An idempotent task: N pushes of one (order_id, amount) charge once."""
    if sleep_s:
        time.sleep(sleep_s)
    _record(f"charge:{order_id}", ctx)
    return {"order_id": order_id, "amount": amount, "task_id": ctx.task_id}


@rl_task(name="demo.refund", idempotent=True)
def refund(ctx: TaskContext, order_id: str, amount: int, sleep_s: float = 0.0) -> dict:
    """Same arguments as ``charge``, a different task: never shares its result."""
    _record(f"refund:{order_id}", ctx)
    return {"refunded": order_id, "task_id": ctx.task_id}


@rl_task(name="demo.flaky", retry_on=(TimeoutError,), max_retries=3, retry_backoff=0.05)
def flaky(ctx: TaskContext, label: str, failures: int) -> dict:
    """Raises TimeoutError on its first ``failures`` runs, then succeeds."""
    runs = _record(label, ctx)
    if runs <= failures:
        raise TimeoutError(f"run {runs} of {label} timed out")
    return {"runs": runs, "attempt": ctx.attempt, "fence": ctx.fence_token}


@rl_task(name="demo.explode", idempotent=True)
def explode(label: str) -> None:
    """Always raises: lands in the DLQ with reason ``exception``."""
    _record(label)
    raise ValueError(f"cannot process {label}")


@rl_task(name="demo.until_fixed")
def until_fixed(ctx: TaskContext, label: str, note: str = "") -> dict:
    """Raises while ``demo:broken:<label>`` exists: an operator "fixes" it by deleting
    that key, then releases the DLQ entry, and the task runs once more and commits."""
    runs = _record(label, ctx)
    if _redis().exists(f"demo:broken:{label}"):
        raise ValueError(f"{label} is broken ({note})" if note else f"{label} is broken")
    return {"label": label, "runs": runs, "fence": ctx.fence_token}


@rl_task(name="demo.unserializable")
def unserializable(label: str) -> object:
    _record(label)
    return object()


@rl_task(name="demo.noop")
async def noop() -> None:
    """Does nothing: for overhead benchmarks."""


@shared_task(name="demo.plain_noop")
def plain_noop() -> None:
    """Vanilla Celery no-op: the baseline of the overhead benchmarks."""


@rl_task(name="demo.self_destruct", max_resurrections=2)
def self_destruct(ctx: TaskContext, label: str) -> None:
    """Kills the process running it, every time: a poison task for the resurrection limit."""
    import os
    import signal

    _record(label, ctx)
    os.kill(os.getpid(), signal.SIGKILL)


def _mark_start(label: str, fence: int) -> None:
    _redis().rpush(f"demo:start:{label}", f"{fence}:{time.time()}")


@shared_task(name="demo.plain_work")
def plain_work(label: str, sleep_s: float) -> None:
    """Vanilla Celery contender of the delivery benchmark: logs each start and run."""
    _mark_start(label, 0)
    time.sleep(sleep_s)
    _redis().rpush(f"demo:exec:{label}", "0")


@rl_task(name="demo.work")
def work(ctx: TaskContext, label: str, sleep_s: float) -> None:
    """relier contender of the delivery benchmark: the same work, fenced."""
    _mark_start(label, ctx.fence_token)
    time.sleep(sleep_s)
    _redis().rpush(f"demo:exec:{label}", str(ctx.fence_token))


@rl_task(name="demo.fragile", max_resurrections=1)
def fragile(ctx: TaskContext, label: str, deaths: int) -> dict:
    """Kills the process running it on its first ``deaths`` runs, then succeeds."""
    import os
    import signal

    runs = _record(label, ctx)
    if runs <= deaths:
        os.kill(os.getpid(), signal.SIGKILL)
    return {
        "runs": runs,
        "fence": ctx.fence_token,
        "attempt": ctx.attempt,
        "resurrections": ctx.resurrections,
    }


async def _soft_hook(ctx: TaskContext) -> None:
    """The soft-timeout hook: note it ran, and checkpoint where the task got to."""
    _redis().rpush(f"demo:soft:{ctx.task_id}", ctx.fence_token)
    await ctx.aset_partial({**(ctx.get_partial() or {}), "soft_timeout": True})


@rl_task(name="demo.slow_steps", soft_timeout=0.8, hard_timeout=2.0, on_soft_timeout=_soft_hook)
async def slow_steps(ctx: TaskContext, label: str, steps: int, step_s: float) -> dict:
    """Checkpoints each step; too slow for its hard timeout when steps x step_s > 2 s."""
    _record(label, ctx)
    try:
        for step in range(steps):
            await ctx.aset_partial({**(ctx.get_partial() or {}), "step": step})
            await asyncio.sleep(step_s)
        return {"label": label, "steps": steps}
    finally:
        _redis().rpush(f"demo:finally:{label}", ctx.fence_token)


@rl_task(name="demo.resumable")
def resumable(ctx: TaskContext, label: str, steps: int, step_s: float) -> dict:
    """Resumes from its checkpoint: records the step each incarnation started at."""
    start = (ctx.get_partial() or {}).get("next", 0)
    _redis().rpush(f"demo:resumed:{label}", start)
    for step in range(start, steps):
        time.sleep(step_s)
        ctx.set_partial({"next": step + 1})
    return {"label": label, "started_at": start}


@rl_task(name="demo.fix_then_resume")
def fix_then_resume(ctx: TaskContext, label: str) -> dict:
    """Checkpoints phase 1, then fails while ``demo:broken:<label>`` exists; released
    after the fix, it resumes from the checkpoint instead of redoing phase 1."""
    seen = ctx.get_partial()
    _redis().rpush(f"demo:seen:{label}", json.dumps(seen))
    if seen is None:
        ctx.set_partial({"phase": 1})
    if _redis().exists(f"demo:broken:{label}"):
        raise ValueError(f"{label} is broken")
    return {"label": label, "resumed_from": seen}


@rl_task(name="demo.checkpoint_bytes")
async def checkpoint_bytes(ctx: TaskContext, size: int) -> str:
    """Saves a checkpoint of about ``size`` bytes and returns its read-back length."""
    await ctx.aset_partial("x" * size)
    return str(len(ctx.get_partial()))


@rl_task(name="demo.limited", rate_limit="3/m")
def limited(label: str) -> str:
    """Admission-controlled: at most 3 pushes a minute are accepted."""
    _record(label)
    return label


def _broken_hook(ctx: TaskContext) -> None:
    raise RuntimeError("the soft hook itself failed")


@rl_task(name="demo.stubborn", soft_timeout=0.3, hard_timeout=1.0, on_soft_timeout=_broken_hook)
async def stubborn(ctx: TaskContext, label: str) -> str:
    """Swallows its cancellation and returns anyway; its soft hook raises."""
    _record(label, ctx)
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        return "swallowed"
    return "slept"
