"""The per-process event loop: one asyncio loop in a daemon thread, created lazily
after fork, that runs tasks and their heartbeats.

Sync code crosses into it with :func:`run` (``run_coroutine_threadsafe``). Calling
:func:`run` from inside a running loop raises, because it would block that loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_loop_pid: int | None = None


def loop() -> asyncio.AbstractEventLoop:
    """This process's bridge loop, started on first use (and again after a fork)."""
    global _loop, _loop_pid
    pid = os.getpid()
    if _loop is not None and _loop_pid == pid:
        return _loop
    with _lock:
        if _loop is None or _loop_pid != pid:
            new_loop = asyncio.new_event_loop()
            ready = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(new_loop)
                new_loop.call_soon(ready.set)
                new_loop.run_forever()

            threading.Thread(target=serve, name="relier-bridge", daemon=True).start()
            ready.wait()
            _loop, _loop_pid = new_loop, pid
    return _loop


def in_running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def run(coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
    """Run ``coro`` on the bridge loop and wait for its result from sync code."""
    if in_running_loop():
        coro.close()
        raise RuntimeError("bridge.run() called from inside a running event loop")
    future = asyncio.run_coroutine_threadsafe(coro, loop())
    try:
        return future.result(timeout_s)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise TimeoutError(f"bridge call did not finish within {timeout_s}s") from None


def spawn(coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
    """Schedule ``coro`` on the bridge loop without waiting for it."""
    return asyncio.run_coroutine_threadsafe(coro, loop())
