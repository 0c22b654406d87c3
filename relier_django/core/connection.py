"""Redis clients: one sync client per process, one asyncio client per event loop.

Fork safety: clients are cached per PID, so a prefork child never reuses a socket
its parent opened (redis-py's pools also check the PID, this makes it explicit).
Async clients are cached per event loop and never cross loops.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.backoff
import redis.retry

from .config import Config

# A restart or a brief network cut must not fail a task's start or commit: retry
# connection errors with backoff for about five seconds (redis-py's default gives up
# within one). Every script these clients run is safe to re-run after an unseen
# success: fence checks and push.lua's same-envelope check make a replay a no-op or a
# refusal. (ratelimit.lua is not, which is why the limiter uses a fail-fast client.)
_RETRIES = 8
# Fail-fast clients (the view rate limiter) give up at once: a request must not wait
# seconds for Redis, and a hit must not be counted twice by a retry after a lost reply.
_FAST_TIMEOUT_S = 1.0


def _backoff() -> redis.backoff.AbstractBackoff:
    return redis.backoff.ExponentialWithJitterBackoff(base=0.05, cap=1.0)


_lock = threading.Lock()
_sync: dict[tuple[int, str, bool], redis.Redis] = {}
_async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, redis.asyncio.Redis]] = (
    weakref.WeakKeyDictionary()
)


def redact(url: str) -> str:
    """The URL with its password replaced, for logs and error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _options(config: Config, fail_fast: bool) -> dict[str, Any]:
    timeout = min(config.redis_socket_timeout_s, _FAST_TIMEOUT_S) if fail_fast else None
    return {
        "decode_responses": True,
        "socket_timeout": timeout or config.redis_socket_timeout_s,
        "socket_connect_timeout": timeout or config.redis_socket_timeout_s,
        "health_check_interval": 30,
    }


def sync_client(config: Config, *, fail_fast: bool = False) -> redis.Redis:
    """This process's client for ``config.redis_url`` (decoded str replies).

    ``fail_fast``: no retries and a short timeout, for callers that must answer now.
    """
    key = (os.getpid(), config.redis_url, fail_fast)
    client = _sync.get(key)
    if client is None:
        with _lock:
            client = _sync.get(key)
            if client is None:
                retry = redis.retry.Retry(_backoff(), 0 if fail_fast else _RETRIES)
                client = redis.Redis.from_url(
                    config.redis_url, retry=retry, **_options(config, fail_fast)
                )
                _sync[key] = client
    return client


def async_client(config: Config, *, fail_fast: bool = False) -> redis.asyncio.Redis:
    """The running loop's client for ``config.redis_url``. Call from inside the loop."""
    loop = asyncio.get_running_loop()
    per_loop = _async.get(loop)
    if per_loop is None:
        per_loop = _async[loop] = {}
    key = f"{config.redis_url}#fast" if fail_fast else config.redis_url
    client = per_loop.get(key)
    if client is None:
        retry = redis.asyncio.retry.Retry(_backoff(), 0 if fail_fast else _RETRIES)
        client = per_loop[key] = redis.asyncio.Redis.from_url(
            config.redis_url, retry=retry, **_options(config, fail_fast)
        )
    return client


async def close_loop_clients() -> None:
    """Close the running loop's clients (before a disposable loop is closed)."""
    per_loop = _async.pop(asyncio.get_running_loop(), {})
    for client in per_loop.values():
        await client.aclose()


def _after_fork_in_child() -> None:
    # The parent's sockets belong to the parent; forget them without closing them.
    _sync.clear()
    _async.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
