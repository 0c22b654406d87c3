"""Tasks with flow control (docs/flow-control.md), for tests/integration's limits tests,
the chaos tests and bench/flow_control.py. Each records its start and its end on the
Redis clock, with its key and fence, so a test can read how many ran at once per key.

Every worker imports this module (``CELERY_IMPORTS``)."""

from __future__ import annotations

import os
import signal
import time

from relier_django import TaskContext, rl_task
from relier_django.core.model import config
from relier_django.core.store.connection import sync_client


def _now_ms() -> int:
    seconds, micros = sync_client(config.current()).time()
    return int(seconds) * 1000 + int(micros) // 1000


def _span(ctx: TaskContext, run: str, key: str, label: str, sleep_s: float, die: str) -> str:
    """Records ``start|end:<key>:<label>:<fence>:<ms>:<pid>`` in ``demo:lim:<run>``;
    kills its own process on its first run when ``die`` is its label's marker."""
    client = sync_client(config.current())
    client.rpush(
        f"demo:lim:{run}", f"start:{key}:{label}:{ctx.fence_token}:{_now_ms()}:{os.getpid()}"
    )
    if die and client.set(f"demo:lim:died:{run}:{label}", "1", nx=True):
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(sleep_s)
    client.rpush(
        f"demo:lim:{run}", f"end:{key}:{label}:{ctx.fence_token}:{_now_ms()}:{os.getpid()}"
    )
    return label


@rl_task(name="demo.lim.per_key", concurrency=2, concurrency_key="customer")
def per_key(ctx: TaskContext, run: str, customer: str, label: str, sleep_s: float = 0.0,
            die: str = "") -> str:  # fmt: skip
    """At most 2 at once per customer."""
    return _span(ctx, run, customer, label, sleep_s, die)


@rl_task(name="demo.lim.sequence", concurrency=1, concurrency_key="customer")
def sequence(ctx: TaskContext, run: str, customer: str, label: str, sleep_s: float = 0.0,
             die: str = "") -> str:  # fmt: skip
    """One at a time per customer, in push order."""
    return _span(ctx, run, customer, label, sleep_s, die)


@rl_task(name="demo.lim.shared", limit="shared", concurrency_key="tenant")
def shared(ctx: TaskContext, run: str, tenant: str, label: str, sleep_s: float = 0.0,
           die: str = "") -> str:  # fmt: skip
    """The named limit 'shared' (2 slots for every tenant together, served in turn)."""
    return _span(ctx, run, tenant, label, sleep_s, die)


@rl_task(name="demo.lim.rated", rate="20/s")
def rated(ctx: TaskContext, run: str, label: str) -> str:
    """Dispatched at most 20 per second, across every worker."""
    return _span(ctx, run, "", label, 0.0, "")


@rl_task(name="demo.lim.flaky", concurrency=1, concurrency_key="customer", max_retries=2,
         retry_on=(RuntimeError,), retry_backoff=0.05)  # fmt: skip
def flaky(ctx: TaskContext, run: str, customer: str, label: str) -> str:
    """Fails its first attempt (a retry keeps the key's slot), then succeeds."""
    _span(ctx, run, customer, label, 0.0, "")
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails")
    return label


@rl_task(name="demo.lim.free")
def free(ctx: TaskContext, run: str, key: str, label: str, sleep_s: float = 0.0) -> str:
    """No flow control of its own: a push's ``limit=`` and ``concurrency_key=`` give it
    one (tests/integration/push/test_limits_per_call.py)."""
    return _span(ctx, run, key, label, sleep_s, "")


@rl_task(name="demo.lim.free_fails")
def free_fails(ctx: TaskContext, run: str, key: str, label: str) -> str:
    """Records its run, then fails: lands in the DLQ at once (no retries)."""
    _span(ctx, run, key, label, 0.0, "")
    raise RuntimeError(f"{label} fails")
