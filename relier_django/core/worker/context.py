"""The context a task may declare as its first parameter."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from celery.exceptions import MaxRetriesExceededError, Retry

from .. import crashpoint
from ..model import config as config_mod
from ..model.errors import TaskLost
from ..model.request import Request, RetryPolicy, RetryRequest
from ..store import progress as progress_store


@dataclass(slots=True)
class TaskContext:
    """What a running incarnation knows about itself.

    Attributes:
        task_id: stable across retries and resurrections.
        fence_token: grows with every incarnation; fence your own writes with it.
        attempt: 1 for the first execution, +1 per retry.
        resurrections: how many times the task was re-dispatched after a worker died.
        task_name: the task's full dotted name.
        worker: ``hostname:pid`` of the process running this incarnation.
        scheduled_at: when the task was due, timezone-aware (UTC): a countdown's or an
            eta's due time, a periodic tick's time; ``None`` for a task pushed to run now.
    """

    task_id: str
    fence_token: int
    attempt: int
    resurrections: int
    task_name: str
    worker: str
    scheduled_at: datetime | None = None
    # The task's identity (Envelope.identity): its id and its push's token, which a
    # later task given the same caller-chosen id does not share.
    identity: str = ""
    # Celery's view of this incarnation (``request``), the task's retry limits, and
    # what ``retry()`` decided, which the runner reads once the body has ended.
    _request: Request | None = field(default=None, repr=False)
    _retry_policy: RetryPolicy = field(default_factory=RetryPolicy, repr=False)
    _retry: RetryRequest | None = field(default=None, repr=False)
    _lost: threading.Event = field(default_factory=threading.Event, repr=False)
    # Set by the runner: the latest checkpoint, and how to store a new one.
    _partial: Any = field(default=None, repr=False)
    _save: Callable[[Any], Awaitable[None]] | None = field(default=None, repr=False)
    # Set by the runner: how to store a progress record (progress.lua, fenced).
    _report: Callable[[str], Coroutine[Any, Any, None]] | None = field(default=None, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    hard_timed_out: bool = field(default=False, repr=False)
    _inline: bool = field(default=False, repr=False)  # see inline()

    @classmethod
    def inline(
        cls,
        task_name: str,
        task_id: str | None = None,
        attempt: int = 1,
        *,
        fence_token: int = 0,
        request: Request | None = None,
        retry_policy: RetryPolicy | None = None,
    ) -> TaskContext:
        """A context for the body called in this process (``task(...)``, ``run()``,
        ``apply()``, eager mode): never superseded, checkpoints kept in memory only.
        Eager mode passes the attempt and a fence that grow with each retry, as a
        worker's would."""
        ctx = cls(
            task_id or uuid.uuid4().hex, fence_token, attempt, 0, task_name,
            f"{socket.gethostname()}:{os.getpid()}",
        )  # fmt: skip
        ctx._inline = True
        ctx._request = request
        if retry_policy is not None:
            ctx._retry_policy = retry_policy
        return ctx

    @property
    def idempotency_key(self) -> str:
        """A key that stays the same for every incarnation of this task (retries,
        resurrections, a zombie) and that no other task shares, not even one pushed
        later under the same caller-chosen id: pass it to an external API's
        idempotency header (a payment provider's ``Idempotency-Key``), so that a call
        repeated by a later incarnation is recognised there, and only that. Derive
        one per call for several calls: ``f"{ctx.idempotency_key}:refund"``.
        ``"relier-<task id>~<push token>"`` (``"relier-<task id>"`` for a task pushed
        by a release without push tokens)."""
        return f"relier-{self.identity or self.task_id}"

    @property
    def request(self) -> Request:
        """Celery's ``self.request`` for this incarnation, read-only: ``id``,
        ``retries`` (``attempt - 1``), ``args``, ``kwargs``, ``eta``, ``hostname``,
        ``delivery_info``, ``is_eager``, ``called_directly``, ``root_id``, ``group``,
        ``group_index``, ``chord``, ``correlation_id``, ``task``, ``priority``,
        ``parent_id``, ``expires``. A Celery
        field relier cannot honour (``headers``, ``callbacks``, ...) raises
        ``NotImplementedError`` naming what to use instead."""
        if self._request is None:  # a context built by hand: what it knows
            self._request = Request(
                self.task_id, self.task_name, self.attempt - 1, scheduled_at=self.scheduled_at,
                hostname=self.worker.rpartition(":")[0], called_directly=self._inline,
            )  # fmt: skip
        return self._request

    def retry(
        self,
        args: Any = None,
        kwargs: Any = None,
        exc: Exception | None = None,
        throw: bool = True,
        eta: datetime | None = None,
        countdown: float | None = None,
        max_retries: int | None = None,
        **options: Any,
    ) -> Retry:
        """Celery's ``self.retry()``: end this incarnation and run the task again, as a
        new incarnation (``attempt + 1``, ``fence_token + 1``) that waits in Redis until
        it is due, in no worker's memory, and runs once: ``raise self.retry(exc=exc,
        countdown=5)``.

        Due after ``countdown`` seconds, at ``eta`` (timezone-aware), or else after the
        task's ``default_retry_delay`` (180 s, as in Celery). Once the task has been
        retried ``max_retries`` times (this call's, else the task's, else 3), ``exc``
        is raised instead (``MaxRetriesExceededError`` without one) and, unless the
        body catches it, the task lands in the DLQ with reason ``retries_exhausted``.
        With ``throw=False`` the ``Retry`` is returned instead of raised: the body goes
        on, and when it ends the task is retried all the same (its return value is not
        committed). Called on a body run as a function (``task(...)``), it raises
        ``exc`` (or ``Retry``) at once, as Celery's does. Other Celery options
        (``queue``, ``priority``, ...) are accepted and not used: a retry keeps the
        task's queue.

        Raises:
            celery.exceptions.Retry: the retry is decided (``throw=True``).
            celery.exceptions.MaxRetriesExceededError: no retries left and no ``exc``.
            TypeError: ``args=`` or ``kwargs=`` (a retry runs the same arguments: push a
                new task for others), a naive ``eta``, a negative ``countdown``.
        """
        if args is not None or kwargs is not None:
            raise TypeError(
                "self.retry(args=..., kwargs=...): a relier retry is the same task with "
                "the same arguments (its envelope is checksummed); push a new task to run "
                "others"
            )
        if eta is not None and (not isinstance(eta, datetime) or eta.tzinfo is None):
            raise TypeError(f"self.retry(eta=...) takes a timezone-aware datetime, got {eta!r}")
        if countdown is not None and countdown < 0:
            raise TypeError(f"self.retry(countdown=...) must be >= 0, got {countdown!r}")
        if self.request.called_directly:
            raise exc or Retry("Task can be retried", None)
        limit = self._retry_policy.max_retries if max_retries is None else max_retries
        if limit is not None and self.attempt > limit:
            # Out of retries: the exception ending the body is a retries_exhausted one.
            self._retry = RetryRequest(exc=exc, exhausted=True)
            if exc is not None:
                raise exc
            request = self.request
            raise MaxRetriesExceededError(
                f"Can't retry {self.task_name}[{self.task_id}] args:{list(request.args)} "
                f"kwargs:{dict(request.kwargs)}",
                task_args=list(request.args),
                task_kwargs=dict(request.kwargs),
            )
        if eta is not None:
            delay_s = max(0.0, (eta - datetime.now(eta.tzinfo)).total_seconds())
        elif countdown is not None:
            delay_s = float(countdown)
        else:
            delay_s = self._retry_policy.default_delay_s
        error = f"{type(exc).__name__}: {exc}" if exc is not None else "Retry"
        self._retry = RetryRequest(delay_s, error, exc)
        decided = Retry(exc=exc, when=eta or delay_s, is_eager=self.request.is_eager)
        if throw:
            raise decided
        return decided

    def get_partial(self, default: Any = None) -> Any:
        """The latest checkpoint of this task, or ``default`` if it has none.

        A resurrected, retried or released incarnation starts with the checkpoint its
        predecessor saved last; reading it costs no round trip.
        """
        return default if self._partial is None else self._partial

    async def aset_partial(self, state: Any) -> None:
        """Save ``state`` (JSON) as this task's checkpoint, for ``async def`` tasks.

        Stored with the task before this returns. Only the current incarnation can
        save: a superseded one gets ``TaskLost``.

        Raises:
            TypeError: ``state`` is not JSON-serialisable.
            CheckpointTooLarge: over CHECKPOINT_MAX_BYTES with no CHECKPOINT_DIR.
            TaskLost: this incarnation was superseded.
        """
        if self._inline:
            self._partial = _checked(state)
            return
        if self._save is None:
            raise RuntimeError("this TaskContext is not attached to a running incarnation")
        await self._save(state)
        self._partial = state
        crashpoint.cross(crashpoint.CHECKPOINT, self.task_name)

    def set_partial(self, state: Any) -> None:
        """The same as ``aset_partial``, for plain ``def`` tasks (off the event loop)."""
        if self._inline:
            self._partial = _checked(state)
            return
        loop = self._loop
        if loop is None:
            raise RuntimeError("this TaskContext is not attached to a running incarnation")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError("inside an async def task, use `await ctx.aset_partial(state)`")
        asyncio.run_coroutine_threadsafe(self.aset_partial(state), loop).result()

    def is_current(self) -> bool:
        """False once this incarnation learned it was superseded (its fence moved).

        Learned at the next heartbeat refresh, so at most one refresh interval late;
        a superseded incarnation can never commit whatever this returns.
        """
        return not self._lost.is_set()

    def ensure_current(self) -> None:
        """Raise ``TaskLost`` if this incarnation was superseded: a cheap check for
        long-running plain ``def`` tasks, which cannot be cancelled from outside."""
        if self._lost.is_set():
            raise TaskLost(
                f"task {self.task_id}: incarnation with fence {self.fence_token} was superseded"
            )

    def mark_lost(self) -> None:
        self._lost.set()

    async def aset_progress(self, meta: Any, state: str = "PROGRESS") -> None:
        """Report progress, for ``async def`` tasks: ``await ctx.aset_progress({"done":
        3, "total": 10})``. Readable from any process until the task ends:
        ``AsyncResult(id).state`` is ``state`` and ``.info`` is ``meta``, and the admin's
        task page and the live view show it.

        Stored with the task before this returns, fenced: only the current incarnation
        can report, a superseded one (a zombie) gets ``TaskLost`` and the progress stays
        its successor's. Kept through retries and resurrections (a new incarnation shows
        the last progress until it reports its own); gone once the task commits, is
        dead-lettered or cancelled, when readers see the outcome instead. In eager mode
        and in ``task(...)`` calls it is kept in this process's memory.

        Args:
            meta: JSON, at most ``CHECKPOINT_MAX_BYTES`` with the state.
            state: a state of your own naming (``"PROGRESS"``), or ``"STARTED"``; the
                states relier decides (``PENDING``, ``RETRY``, ``SUCCESS``,
                ``FAILURE``, ``REVOKED``...) are refused.

        Raises:
            ValueError: ``state`` is one relier decides, empty or over 64 characters.
            TypeError: ``meta`` is not JSON-serialisable.
            ProgressTooLarge: the progress is larger than ``CHECKPOINT_MAX_BYTES``.
            TaskLost: this incarnation was superseded.
        """
        stored = progress_store.record(state, meta, self._progress_limit())
        if self._inline:
            progress_store.remember(self.task_id, stored)
            return
        if self._report is None:
            raise RuntimeError("this TaskContext is not attached to a running incarnation")
        await self._report(stored)

    def set_progress(self, meta: Any, state: str = "PROGRESS") -> None:
        """The same as ``aset_progress``, for plain ``def`` tasks (off the event loop)."""
        stored = progress_store.record(state, meta, self._progress_limit())
        if self._inline:
            progress_store.remember(self.task_id, stored)
            return
        loop, report = self._loop, self._report
        if loop is None or report is None:
            raise RuntimeError("this TaskContext is not attached to a running incarnation")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError("inside an async def task, use `await ctx.aset_progress(meta)`")
        asyncio.run_coroutine_threadsafe(report(stored), loop).result()

    def update_state(
        self, task_id: str | None = None, state: str | None = None, meta: Any = None
    ) -> None:
        """Celery's ``Task.update_state``, for a bound task (``self.update_state(
        state="PROGRESS", meta={"done": 3, "total": 10})``): ``set_progress(meta,
        state)``, with what it guarantees.

        Args:
            task_id: None, or this task's own id: a task reports only its own progress
                (another task's is fenced by that task's incarnation).
            state: as ``set_progress``'s; None (Celery's default, which stores no
                state) reports ``STARTED`` with ``meta``.
            meta: JSON, as ``set_progress``'s.

        Raises:
            ValueError: another task's id, or a state relier decides.
            TypeError, ProgressTooLarge, TaskLost: as ``set_progress``.
        """
        if task_id is not None and task_id != self.task_id:
            raise ValueError(
                f"update_state(task_id={task_id!r}): a task reports its own progress only "
                f"(this is {self.task_id!r}); leave task_id out"
            )
        self.set_progress(meta, progress_store.checked_state(state))

    def _progress_limit(self) -> int:
        return config_mod.current().checkpoint_max_bytes


def _checked(state: Any) -> Any:
    # What a stored checkpoint would refuse, an inline one refuses too.
    json.dumps(state, allow_nan=False)
    return state
