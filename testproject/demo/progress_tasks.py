"""Tasks that report progress (docs/progress.md), for tests/integration/worker/test_progress.py:
Celery's idiom (``bind=True`` and ``self.update_state``) and relier's (``ctx.set_progress``).

Each records what it did in ``demo:progress:<run>`` (``reported:<fence>``,
``refused:<fence>``, ``resumed:<fence>``...) and waits for the test's gate
``demo:progress:<run>:go:<fence>`` where a test must read it mid-run.

Every worker imports this module (``CELERY_IMPORTS``)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

from relier_django import TaskContext, TaskLost, rl_task
from relier_django.core.model import config
from relier_django.core.store.connection import async_client, sync_client

_GATE_MAX_S = 60.0  # a test that never opens a gate fails on its own timeout first


def _log(run: str, entry: str) -> None:
    sync_client(config.current()).rpush(f"demo:progress:{run}", entry)


def _wait_gate(run: str, fence: int) -> None:
    client = sync_client(config.current())
    deadline = time.monotonic() + _GATE_MAX_S
    while not client.exists(f"demo:progress:{run}:go:{fence}"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate of {run} fence {fence} never opened")
        time.sleep(0.02)


@rl_task(name="demo.progress.steps", bind=True)
def steps(self: Any, run: str) -> dict:
    """Celery's idiom: ``update_state`` PROGRESS, wait for the gate, report again (a
    superseded incarnation records that it was refused), return."""
    fence = self.fence_token
    self.update_state(state="PROGRESS", meta={"step": "first", "fence": fence})
    _log(run, f"reported:{fence}")
    _wait_gate(run, fence)
    try:
        self.update_state(state="PROGRESS", meta={"step": "second", "fence": fence})
    except TaskLost:
        _log(run, f"refused:{fence}")
        raise
    _log(run, f"second:{fence}")
    return {"run": run, "fence": fence}


@rl_task(name="demo.progress.asteps")
async def asteps(ctx: TaskContext, run: str) -> dict:
    """relier's idiom in an ``async def`` task: ``await ctx.aset_progress``."""
    fence = ctx.fence_token
    await ctx.aset_progress({"step": "first", "fence": fence})
    client = async_client(config.current())
    await client.rpush(f"demo:progress:{run}", f"reported:{fence}")
    deadline = time.monotonic() + _GATE_MAX_S
    while not await client.exists(f"demo:progress:{run}:go:{fence}"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate of {run} fence {fence} never opened")
        await asyncio.sleep(0.02)
    return {"run": run, "fence": fence}


@rl_task(name="demo.progress.dies_once")
def dies_once(ctx: TaskContext, run: str) -> dict:
    """Reports progress and kills its own process on its first run; the resurrected
    incarnation reports nothing, so what readers see is its predecessor's progress."""
    fence = ctx.fence_token
    if sync_client(config.current()).set(f"demo:progress:{run}:died", "1", nx=True):
        ctx.set_progress({"done": 1, "fence": fence})
        os.kill(os.getpid(), signal.SIGKILL)
    _log(run, f"resumed:{fence}")
    _wait_gate(run, fence)
    return {"run": run, "fence": fence}


@rl_task(name="demo.progress.inline")
def inline(ctx: TaskContext, run: str, gate_s: float = 0.0) -> dict:
    """For eager mode: reports progress, then waits for its gate (fence 1, as a worker's
    first incarnation holds)."""
    ctx.set_progress({"step": "first"}, state="WORKING")
    if gate_s:
        _wait_gate(run, ctx.fence_token)
    return {"run": run}
