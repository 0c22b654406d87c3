"""Celery's task for ``bench/worker_memory.py``: what ``memory_tasks.work`` does, as a
plain Celery task in a project without relier_django (it imports nothing of it)."""

from __future__ import annotations

import os
import time

import redis
from celery import shared_task

_clients: dict[int, redis.Redis] = {}


def client() -> redis.Redis:
    """This process's own client of the benchmark's Redis (a pool process's own)."""
    pid = os.getpid()
    if pid not in _clients:
        _clients[pid] = redis.Redis.from_url(os.environ["RELIER_REDIS_URL"])
    return _clients[pid]


@shared_task(name="bench.plain_work")
def plain_work(label: str, sleep_s: float) -> None:
    """Records its start (``<fence>:<time>:<pid>``, as ``bench.delivery`` reads it) and
    its run."""
    client().rpush(f"demo:start:{label}", f"0:{time.time()}:{os.getpid()}")
    time.sleep(sleep_s)
    client().rpush(f"demo:exec:{label}", "0")
