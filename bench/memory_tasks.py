"""relier_django's task for ``bench/worker_memory.py``: the same body as
``memory_plain_tasks.plain_work`` (the same Redis client), as an ``@rl_task``."""

from __future__ import annotations

import os
import time

from bench.memory_plain_tasks import client
from relier_django import TaskContext, rl_task


@rl_task(name="bench.work")
def work(ctx: TaskContext, label: str, sleep_s: float) -> None:
    client().rpush(f"demo:start:{label}", f"{ctx.fence_token}:{time.time()}:{os.getpid()}")
    time.sleep(sleep_s)
    client().rpush(f"demo:exec:{label}", str(ctx.fence_token))
