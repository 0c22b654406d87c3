"""bench/flow_control.py's throughput contender: ``demo.work`` (testproject/demo/tasks.py)
once more, with a concurrency limit it never reaches, so the two differ only in the
gate (docs/flow-control.md): a slot taken at push, the dispatch by the scanner leader,
the slot freed at commit. The same records as ``demo.work``, so bench/throughput.py's
wait counts both alike.

Every worker imports this module (``CELERY_IMPORTS``)."""

from __future__ import annotations

import os
import time

from relier_django import TaskContext, rl_task
from relier_django.core.model import config
from relier_django.core.store.connection import sync_client

# Far above what a run holds at once: the limit is checked at every push, never reached.
NEVER_REACHED = 10_000


@rl_task(name="bench.lim.wide", concurrency=NEVER_REACHED)
def wide(ctx: TaskContext, label: str, sleep_s: float) -> None:
    """``demo.work`` under ``concurrency=10_000``."""
    client = sync_client(config.current())
    client.rpush(f"demo:start:{label}", f"{ctx.fence_token}:{time.time()}:{os.getpid()}")
    time.sleep(sleep_s)
    client.rpush(f"demo:exec:{label}", str(ctx.fence_token))
