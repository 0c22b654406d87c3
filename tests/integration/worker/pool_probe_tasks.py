"""A task that reports, from the pool process that runs it, what that process shares
with its worker's main process, for ``test_pool_sharing.py``; loaded into a worker
with ``--include`` only."""

from __future__ import annotations

import gc
import json
import os
import sys

import redis
from celery import shared_task


@shared_task(name="probe.pool_state")
def pool_state(key: str, modules: list[str]) -> None:
    """RPUSHes to ``key``: this process's pid, how many objects it inherited frozen, and
    which of ``modules`` it has imported."""
    found = {
        "pid": os.getpid(),
        "frozen": gc.get_freeze_count(),
        "imported": [name for name in modules if name in sys.modules],
    }
    client = redis.Redis.from_url(os.environ["RELIER_REDIS_URL"])
    client.rpush(key, json.dumps(found))
    client.close()
