"""A named distributed lock with fencing tokens, kept alive by a heartbeat (docs/lock.md).

Acquire (SET with a TTL, next fencing token), extend and release (compare-and-delete)
are one Lua script each. Each operation is written once, as a generator yielding steps
(a script call, or seconds to sleep) that :func:`_run` performs on a sync client and
:func:`_arun` on an asyncio one."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis
import redis.asyncio

from ..model.config import Config, current
from ..model.errors import LockLost, LockNotAcquired
from ..store import scripts
from ..store.connection import async_client, sync_client
from ..store.keys import KeySpace

logger = logging.getLogger("relier_django.lock")

T = TypeVar("T")
OnLost = Callable[["Lock"], object]
Steps = Generator[scripts.ScriptCall[Any] | float, Any, T]  # yield: a script, or seconds


def try_acquire(keys: KeySpace, name: str, ttl_ms: int) -> scripts.ScriptCall[int]:
    """The new fencing token, or 0 when another holder has the lock. The call carries
    an attempt id, so its replay after a lost reply answers the token it took."""
    keys_, attempt = keys.for_lock_acquire(name), uuid.uuid4().hex
    return scripts.ScriptCall(scripts.LOCK_ACQUIRE, keys_, [ttl_ms, attempt], int)


def extend(keys: KeySpace, name: str, token: int, ttl_ms: int) -> scripts.ScriptCall[bool]:
    """True when ``token`` still holds the lock, whose TTL is now ``ttl_ms`` again."""
    keys_ = keys.for_lock_extend(name)
    return scripts.ScriptCall(scripts.LOCK_EXTEND, keys_, [token, ttl_ms], lambda r: int(r) == 1)


def release_if_held(keys: KeySpace, name: str, token: int) -> scripts.ScriptCall[bool]:
    """True when the lock is free and no holder came after ``token``."""
    keys_ = keys.for_lock_release(name)
    return scripts.ScriptCall(scripts.LOCK_RELEASE, keys_, [token], lambda r: int(r) == 1)


@dataclass(slots=True)
class _Hold:
    token: int
    # Read before sending the last acquire/extend that succeeded: the key lives at
    # least until confirmed_at + TTL; past that, another holder may run.
    confirmed_at: float
    stop: threading.Event = field(default_factory=threading.Event)
    cancel: Callable[[], object] = lambda: None  # stops an asyncio heartbeat at once
    raised: bool = False  # LockLost was already raised for this acquisition


class Lock:
    """A named lock, built by :func:`lock`; not reentrant, reusable once released. ``lost``
    (a ``threading.Event``, async holders too) is set when this holder learns it lost it."""

    def __init__(
        self, name: str, ttl_s: float, *, config: Config, blocking: bool = True,
        timeout_s: float | None = None, poll_interval_s: float = 0.05,
        on_lost: OnLost | None = None, clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        if not name or any(c in name for c in "{}"):  # a brace would move the hash tag
            raise ValueError(f"lock name must be non-empty, without braces: {name!r}")
        if ttl_s < 0.001 or poll_interval_s <= 0 or (timeout_s or 0) < 0:
            raise ValueError(f"need ttl >= 0.001 s, poll_interval > 0, timeout >= 0 or None; "
                             f"got {ttl_s}, {poll_interval_s}, {timeout_s}")  # fmt: skip
        self.name, self.ttl_s, self.config = name, ttl_s, config
        self.blocking, self.timeout_s, self.poll_interval_s = blocking, timeout_s, poll_interval_s
        self.on_lost, self._clock = on_lost, clock
        self._gives_up_after_s = (timeout_s or 0.0) if blocking else 0.0  # for LockNotAcquired
        self.lost, self._mutex = threading.Event(), threading.Lock()
        self._keys = KeySpace.of(config)
        self._ttl_ms = round(ttl_s * 1000)  # Lua gets integer ms, converted here only
        self._hold: _Hold | None = None

    @property
    def token(self) -> int | None:
        """The fencing token of the current acquisition; None when not held."""
        return getattr(self._hold, "token", None)

    def acquire(self) -> bool:
        """Take the lock, waiting as it was built to (``blocking``, ``timeout``).

        Returns:
            True when acquired; False when another holder kept it (past the timeout).

        Raises:
            RuntimeError: in a running event loop (use ``aacquire``), or held already.
        """
        client = sync_client(self.config)
        hold = _run(self._acquiring(), client, time.sleep)
        if hold is None:
            return False
        beat = functools.partial(_run, self._beating(hold), client, hold.stop.wait)
        threading.Thread(target=beat, name=f"relier-lock:{self.name}", daemon=True).start()
        return True

    async def aacquire(self) -> bool:
        """Async twin of :meth:`acquire`; the heartbeat is a task on the running loop."""
        client = async_client(self.config)
        hold = await _arun(self._acquiring(), client)
        if hold is None:
            return False
        loop = asyncio.get_running_loop()
        beat = loop.create_task(_arun(self._beating(hold), client), name="relier-lock")
        # Threadsafe: release() may run on another thread; the loop may be gone by then.
        hold.cancel = lambda: loop.is_closed() or loop.call_soon_threadsafe(beat.cancel)
        return True

    def release(self) -> bool:
        """Free the lock if this holder still has it (compare-and-delete).

        Returns:
            True when released; False when not ours (anymore): that lock is left intact.

        Raises:
            RuntimeError: in a running event loop (use ``arelease``).
        """
        return _run(self._releasing(), sync_client(self.config), time.sleep)

    async def arelease(self) -> bool:
        """Async twin of :meth:`release`."""
        return await _arun(self._releasing(), async_client(self.config))

    def ensure_held(self) -> None:
        """Raise unless this holder still has the lock; a local check, no round trip.

        Raises:
            LockLost: the lock was taken, expired, or unconfirmed for a whole TTL.
            RuntimeError: the lock is not held (never acquired, or released).
        """
        hold = self._hold
        if hold is None:
            raise RuntimeError(f"lock {self.name!r} is not held")
        if self._is_lost(hold):
            hold.raised = True
            raise LockLost(self.name, hold.token)

    def __enter__(self) -> Lock:
        if not self.acquire():
            raise LockNotAcquired(self.name, self._gives_up_after_s)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        _run(self._exiting(exc_info[1]), sync_client(self.config), time.sleep)

    async def __aenter__(self) -> Lock:
        if not await self.aacquire():
            raise LockNotAcquired(self.name, self._gives_up_after_s)
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await _arun(self._exiting(exc_info[1]), async_client(self.config))

    # -- each operation, written once ---------------------------------------------
    def _acquiring(self) -> Steps[_Hold | None]:
        if self._hold is not None:
            raise RuntimeError(f"lock {self.name!r} is already held by this object")
        deadline = None if self.timeout_s is None else self._clock() + self.timeout_s
        while True:
            sent_at = self._clock()
            token = yield try_acquire(self._keys, self.name, self._ttl_ms)
            if token:
                with self._mutex:
                    self.lost.clear()
                    self._hold = _Hold(token, sent_at)
                    return self._hold
            remaining = float("inf") if deadline is None else deadline - self._clock()
            if not self.blocking or remaining <= 0:
                return None
            yield min(self.poll_interval_s, remaining)

    def _beating(self, hold: _Hold) -> Steps[None]:
        while True:
            yield self.ttl_s / 3
            if hold.stop.is_set():
                return
            sent_at = self._clock()
            try:
                held = yield extend(self._keys, self.name, hold.token, self._ttl_ms)
            except Exception:
                logger.warning("lock heartbeat failed lock=%s", self.name, exc_info=True)
                held = None
            if held:
                hold.confirmed_at = sent_at
            elif held is False:
                self._mark_lost(hold, "taken_or_expired")
                return
            elif self._is_lost(hold):  # failed: only lost once a whole TTL is unconfirmed
                return

    def _releasing(self) -> Steps[bool]:
        # Stop before the DEL: an extension that then finds no key is not a loss.
        with self._mutex:
            hold, self._hold = self._hold, None
        if hold is None:
            return False
        hold.stop.set()
        hold.cancel()
        return bool((yield release_if_held(self._keys, self.name, hold.token)))

    def _exiting(self, exc: BaseException | None) -> Steps[None]:
        hold = self._hold
        lost = hold is not None and self._is_lost(hold)
        try:
            yield from self._releasing()
        except redis.RedisError:  # the work is done; the lock frees itself within a TTL
            logger.warning("lock release failed lock=%s", self.name, exc_info=True)
        # Outranks an Exception (kept as __context__), not LockLost, CancelledError, ^C.
        if lost and hold and not hold.raised and (exc is None or isinstance(exc, Exception)):
            raise LockLost(self.name, hold.token)

    def _is_lost(self, hold: _Hold) -> bool:
        if not self.lost.is_set() and self._clock() - hold.confirmed_at >= self.ttl_s:
            self._mark_lost(hold, "unconfirmed_for_ttl")  # a long pause, Redis away
        return self.lost.is_set()

    def _mark_lost(self, hold: _Hold, reason: str) -> None:
        with self._mutex:
            if hold.stop.is_set() or self._hold is not hold:
                return  # released meanwhile (our own DEL is no loss), or already marked
            hold.stop.set()
            self.lost.set()
        logger.warning("lock lost lock=%s token=%s reason=%s", self.name, hold.token, reason)
        if self.on_lost is not None:
            try:
                self.on_lost(self)
            except Exception:
                logger.exception("on_lost callback failed lock=%s token=%s", self.name, hold.token)


def _run(steps: Steps[T], client: redis.Redis, sleep: Callable[[float], object]) -> T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        steps.close()
        raise RuntimeError("a lock's blocking call would stall the running event loop; use "
                           "aacquire(), arelease() or async with")  # fmt: skip
    reply: Any = None  # a step's result, or the Exception it raised (thrown back in)
    while True:
        try:
            step = steps.throw(reply) if isinstance(reply, Exception) else steps.send(reply)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            reply = step.run(client) if isinstance(step, scripts.ScriptCall) else sleep(step)
        except Exception as exc:
            reply = exc


async def _arun(steps: Steps[T], client: redis.asyncio.Redis) -> T:
    reply: Any = None
    while True:
        try:
            step = steps.throw(reply) if isinstance(reply, Exception) else steps.send(reply)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            if isinstance(step, scripts.ScriptCall):
                reply = await step.arun(client)
            else:
                await asyncio.sleep(step)
                reply = None
        except Exception as exc:
            reply = exc


def lock(
    name: str, ttl: float = 5.0, *, blocking: bool = True, timeout: float | None = None,
    poll_interval: float = 0.05, on_lost: OnLost | None = None,
) -> Lock:  # fmt: skip
    """A distributed lock named ``name`` on the configured Redis (``config.current()``),
    for ``with``, ``async with``, or ``acquire()``/``release()`` and their async twins.

    Args:
        name: every process using the same name contends for the same lock.
        ttl: seconds the lock outlives its holder; extended every ``ttl / 3`` while held.
        blocking: wait for the lock (True) or give up at once (False).
        timeout: when blocking, give up after this many seconds; None waits forever.
        poll_interval: seconds between attempts while waiting.
        on_lost: called with the lock, once, by the thread or loop that sees it lost.

    Returns:
        A :class:`Lock`, not yet acquired.

    Raises:
        ValueError: empty name or braces in it, ttl < 1 ms, timeout < 0, poll_interval <= 0.
    """
    return Lock(name, ttl, config=current(), blocking=blocking, timeout_s=timeout,
                poll_interval_s=poll_interval, on_lost=on_lost)  # fmt: skip
