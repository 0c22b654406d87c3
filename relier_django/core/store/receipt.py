"""What ``push``/``apush`` return: the task id, whether (and how) it was dispatched,
and a way to wait for the outcome.

A push made inside a database transaction is deferred to its commit, so its receipt
starts ``pending`` and is settled, once, by the post-commit delivery
(``aftercommit.deliver``). Everything else about a receipt is fixed when it is made.

``read_status``/``aread_status`` name where a task stands the way Celery names it
(PENDING, STARTED, RETRY, SUCCESS, FAILURE), from the store, in one round trip: a
receipt's ``status`` and the Celery result backend (``relier_django.results``) share it.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, cast

from celery import states

from ..model import config as config_mod
from ..model import outcome
from ..model.config import Config
from ..model.errors import RelierError, TaskCancelled, TaskFailed
from . import event_loop, progress, snapshot
from .cancel import Cancelled, acancel, cancel
from .connection import async_client, sync_client
from .keys import KeySpace
from .snapshot import Reading, Snapshot

_FIRST_POLL_S = 0.002
_MAX_POLL_S = 0.1


class DispatchState(StrEnum):
    """Where a push stands.

    ``PENDING`` is the only state that changes, and only once.
    """

    PENDING = "pending"  # deferred to a transaction's commit: nothing stored or sent yet
    DISPATCHED = "dispatched"  # stored in Redis and accepted by the broker (G1 from here)
    DEDUPLICATED = "deduplicated"  # an idempotent duplicate: nothing sent; see duplicate_of
    FAILED = "failed"  # the post-commit send gave up; logged at ERROR with its envelope
    # The post-commit send failed, but the push is in the committed outbox: the relay
    # sends it (G1 holds, later); get() waits for its result as for DISPATCHED.
    OUTBOX = "outbox"


@dataclass(frozen=True, slots=True)
class Dispatch:
    """The settled state of a push. ``duplicate_of``: the id of the task holding the
    idempotency key (``DEDUPLICATED``); ``error``: why the send gave up (``FAILED``)."""

    state: DispatchState
    duplicate_of: str | None = None
    error: str | None = None


_PENDING = Dispatch(DispatchState.PENDING)
_DISPATCHED = Dispatch(DispatchState.DISPATCHED)


class NotDispatched(RelierError, RuntimeError):
    """``get()``/``aget()`` on a push that was not dispatched: still ``pending`` (its
    transaction has not committed, or rolled back: then it never will be), or
    ``failed`` after the commit (the ERROR log holds its envelope, for replay).

    Attributes:
        task_id: the receipt's task id.
        state: ``DispatchState.PENDING`` or ``DispatchState.FAILED``.
    """

    def __init__(self, task_id: str, state: DispatchState, detail: str) -> None:
        super().__init__(f"task {task_id} was not dispatched ({state}): {detail}")
        self.task_id = task_id
        self.state = state


class Receipt:
    """A pushed task.

    Attributes:
        task_id: the task's id. For a push sent at once that was an idempotent
            duplicate, the id of the task holding the key, so every duplicate sees the
            same result. For a push deferred to a commit, the id assigned at push time,
            whatever happens at the commit: if the commit finds a duplicate, that id is
            never used and :attr:`duplicate_of` names the task that runs instead.
        config: the config the push used (where to read the outcome).
        created_ms: when the push was made (ms since the epoch, the producer's clock,
            as the envelope carries it); None for a receipt not made by a push.
    """

    __slots__ = ("_config", "_created_ms", "_dispatch", "_task_id")

    def __init__(
        self, task_id: str, deduplicated: bool, config: Config, created_ms: int | None = None
    ) -> None:
        self._task_id = task_id
        self._config = config
        self._created_ms = created_ms
        self._dispatch = (
            Dispatch(DispatchState.DEDUPLICATED, duplicate_of=task_id)
            if deduplicated
            else _DISPATCHED
        )

    @classmethod
    def deferred(cls, task_id: str, config: Config, created_ms: int | None = None) -> Receipt:
        """A receipt for a push waiting for its transaction to commit."""
        receipt = cls(task_id, False, config)
        receipt._created_ms = created_ms
        receipt._dispatch = _PENDING
        return receipt

    def settle(self, dispatch: Dispatch) -> None:
        """Record what the commit did with a deferred push. Called once, by the
        post-commit delivery; a settled receipt never changes again."""
        if self._dispatch.state is not DispatchState.PENDING:
            raise RuntimeError(f"receipt {self._task_id} is already {self._dispatch.state}")
        # One attribute store: a reader in another thread sees the old or the new
        # value, never a mix, so no lock is needed.
        self._dispatch = dispatch

    @property
    def task_id(self) -> str:
        return self._task_id

    @property
    def id(self) -> str:
        """Celery's name for :attr:`task_id` (``AsyncResult.id``)."""
        return self._task_id

    @property
    def status(self) -> str:
        """Where the task stands, as Celery names it (``AsyncResult.status``):
        ``PENDING`` (queued, or unknown), ``STARTED`` (or the state it last reported
        while it runs, such as ``PROGRESS``), ``RETRY`` (waiting for its next
        attempt), ``SUCCESS`` or ``FAILURE`` (in the DLQ). Read from the store on each
        access; for a duplicate, the status of the task holding the key (Celery's
        :attr:`state` is the same; where the push stands is :attr:`dispatch_state`).

        Raises:
            RuntimeError: read inside a running event loop; use ``await receipt.astatus()``.
        """
        if event_loop.in_running_loop():
            raise RuntimeError(
                "receipt.status would block the running event loop; use await receipt.astatus()"
            )
        return read_status(self._config, self.duplicate_of or self._task_id).state

    async def astatus(self) -> str:
        """Async twin of :attr:`status`."""
        return (await aread_status(self._config, self.duplicate_of or self._task_id)).state

    @property
    def config(self) -> Config:
        return self._config

    @property
    def created_ms(self) -> int | None:
        """When the push was made (ms since the epoch, the producer's clock)."""
        return self._created_ms

    @property
    def state(self) -> str:
        """Celery's ``AsyncResult.state``: the same as :attr:`status` (``PENDING``,
        ``STARTED``, ``RETRY``, ``SUCCESS``, ``FAILURE``, ``REVOKED``), read from the
        store on each access; while the task runs, the state it last reported
        (``ctx.set_progress``, ``update_state``). Where the *push* stands is
        :attr:`dispatch_state`."""
        return self.status

    @property
    def info(self) -> Any:
        """Celery's ``AsyncResult.info``, read from the store on each access: while the
        task runs, the meta it last reported (``ctx.set_progress(meta)``,
        ``update_state(meta=...)``), else ``{"hostname", "attempt", "fence"}`` of the
        running incarnation; the result once committed; a ``TaskFailed`` once in the
        DLQ; None while queued or unknown. Never waits (:meth:`get` does).

        Raises:
            RuntimeError: read inside a running event loop; use ``await receipt.ainfo()``.
        """
        if event_loop.in_running_loop():
            raise RuntimeError(
                "receipt.info would block the running event loop; use await receipt.ainfo()"
            )
        return read_status(self._config, self.duplicate_of or self._task_id).result

    async def ainfo(self) -> Any:
        """Async twin of :attr:`info`."""
        return (await aread_status(self._config, self.duplicate_of or self._task_id)).result

    def failed(self) -> bool:
        """Celery's ``AsyncResult.failed()``: True when the task is in the DLQ
        (``FAILURE``). Whether the post-commit *send* gave up is :attr:`send_failed`."""
        return self.status == str(states.FAILURE)

    def successful(self) -> bool:
        """Celery's ``AsyncResult.successful()``: True once the task committed."""
        return self.status == str(states.SUCCESS)

    def ready(self) -> bool:
        """Celery's ``AsyncResult.ready()``: True once the task has an outcome
        (committed, in the DLQ, or cancelled)."""
        return self.status in states.READY_STATES

    @property
    def dispatch_state(self) -> DispatchState:
        """Where the push stands: ``pending`` until the transaction commits (forever,
        if it rolls back), then ``dispatched``, ``deduplicated``, ``failed`` or
        ``outbox``. Not Celery's ``state`` (:attr:`state` is)."""
        return self._dispatch.state

    @property
    def pending(self) -> bool:
        """True while the push waits for its transaction to commit. Still True after
        a rollback: nothing was stored or sent, and nothing ever will be."""
        return self._dispatch.state is DispatchState.PENDING

    @property
    def dispatched(self) -> bool:
        """True once this push stored the task and the broker accepted it."""
        return self._dispatch.state is DispatchState.DISPATCHED

    @property
    def deduplicated(self) -> bool:
        """True when this push was an idempotent duplicate and sent nothing."""
        return self._dispatch.state is DispatchState.DEDUPLICATED

    @property
    def send_failed(self) -> bool:
        """True when the post-commit send gave up (see :attr:`error`)."""
        return self._dispatch.state is DispatchState.FAILED

    @property
    def in_outbox(self) -> bool:
        """True when the post-commit send failed and the committed outbox row holds the
        push: the relay sends it (``get()`` waits for its result)."""
        return self._dispatch.state is DispatchState.OUTBOX

    @property
    def duplicate_of(self) -> str | None:
        """For a duplicate, the id of the task holding the idempotency key."""
        return self._dispatch.duplicate_of

    @property
    def error(self) -> str | None:
        """For a failed post-commit send, the last error, ``"Type: message"``."""
        return self._dispatch.error

    def __repr__(self) -> str:
        extra = f" duplicate_of={self.duplicate_of}" if self.duplicate_of else ""
        return f"<Receipt {self._task_id} {self.dispatch_state}{extra}>"

    def _result_key(self) -> str:
        dispatch = self._dispatch
        if dispatch.state is DispatchState.PENDING:
            raise NotDispatched(
                self._task_id,
                dispatch.state,
                "the push waits for its transaction to commit; wait after the atomic "
                "block (after a rollback it is never sent)",
            )
        if dispatch.state is DispatchState.FAILED:
            raise NotDispatched(
                self._task_id,
                dispatch.state,
                f"the send after commit gave up ({dispatch.error}); its envelope is in the "
                "ERROR log, replay it with relier_django.transactions.replay()",
            )
        return KeySpace.of(self.config).result(dispatch.duplicate_of or self._task_id)

    def cancel(self) -> Cancelled:
        """Cancel this task (see :func:`relier_django.cancel`): removed if it has not
        started, fenced off if it runs; ``get()`` then raises ``TaskCancelled``."""
        return cancel(self._config, self._task_id)

    async def acancel(self) -> Cancelled:
        """Async twin of :meth:`cancel`."""
        return await acancel(self._config, self._task_id)

    def get(self, timeout: float | None = None) -> Any:
        """Wait for the committed result (of the task holding the key, for a duplicate).

        Raises:
            TaskFailed: the task is in the dead-letter queue (reason and error attached).
            TimeoutError: no outcome within ``timeout`` seconds (the task may still run).
            NotDispatched: the push is pending or its post-commit send failed.
            RuntimeError: called inside a running event loop; use ``await receipt.aget()``.
        """
        if event_loop.in_running_loop():
            raise RuntimeError(
                "receipt.get() would block the running event loop; use await receipt.aget()"
            )
        key = self._result_key()
        client = sync_client(self.config)
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = _FIRST_POLL_S
        while True:
            record = client.get(key)
            if record is not None:
                return outcome.read(self.duplicate_of or self._task_id, cast(str, record))
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"task {self._task_id}: no outcome within {timeout}s")
            time.sleep(pause)
            pause = min(pause * 2, _MAX_POLL_S)

    async def aget(self, timeout: float | None = None) -> Any:  # noqa: ASYNC109 - mirrors get()
        """Async twin of :meth:`get`."""
        key = self._result_key()
        client = async_client(self.config)
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = _FIRST_POLL_S
        while True:
            record = await client.get(key)
            if record is not None:
                return outcome.read(self.duplicate_of or self._task_id, cast(str, record))
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"task {self._task_id}: no outcome within {timeout}s")
            await asyncio.sleep(pause)
            pause = min(pause * 2, _MAX_POLL_S)


def result(task_id: str) -> Receipt:
    """A receipt for a task pushed elsewhere (another process, an earlier request):
    ``relier_django.result(task_id).get(timeout=30)``.

    Its ``get()``/``aget()`` wait for the outcome and ``status`` reads where the task
    stands, as for the receipt ``push()`` returned. Its ``state`` is ``dispatched``:
    the push is taken to have happened; an id nobody pushed never gets an outcome
    (``status`` stays ``PENDING``, ``get()`` times out).
    """
    return Receipt(task_id, deduplicated=False, config=config_mod.current())


async def aresult(task_id: str) -> Receipt:
    """Async twin of :func:`result`; the receipt reads the store when awaited
    (``await (await relier_django.aresult(task_id)).aget(timeout=30)``)."""
    return result(task_id)


@dataclass(frozen=True, slots=True)
class TaskStatus:
    """Where a task stands, named as Celery names it.

    Attributes:
        task_id: the task's id.
        state: a ``celery.states`` name: ``SUCCESS`` (committed), ``FAILURE`` (in the
            DLQ), ``STARTED`` (an incarnation is running), ``RETRY`` (queued for an
            attempt after a failed one), ``PENDING`` (queued, or unknown); or, while an
            incarnation runs, the state its task last reported (``ctx.set_progress``,
            ``update_state``: ``PROGRESS``, or any name of its own).
        result: ``SUCCESS``: the committed result; ``FAILURE``: a ``TaskFailed``;
            running with progress reported: its meta; ``STARTED`` without:
            ``{"hostname": worker, "attempt": n, "fence": n}``; else None.
        traceback: ``FAILURE``: the failure's traceback from the DLQ entry, if any.
        known: False when the store holds nothing under this id (never pushed, its
            result expired, or not a relier task).
        done_ms: ``FAILURE``: when it was dead-lettered (Redis clock, ms), if known.
    """

    task_id: str
    state: str
    result: Any = None
    traceback: str | None = None
    known: bool = True
    done_ms: int | None = None


def read_status(config: Config, task_id: str) -> TaskStatus:
    """Where ``task_id`` stands, read from the store in one round trip (sync)."""
    found = snapshot.read(sync_client(config), KeySpace.of(config), task_id, Reading.STATE)
    return status_of(found)


async def aread_status(config: Config, task_id: str) -> TaskStatus:
    """Async twin of :func:`read_status`."""
    keys = KeySpace.of(config)
    return status_of(await snapshot.aread(async_client(config), keys, task_id, Reading.STATE))


def status_of(found: Snapshot) -> TaskStatus:
    """Where a task stands, as Celery names it, from what the store holds of it. Between
    two of its keys a task only moves forward (queued, running, an outcome), and the
    snapshot reads them at one instant."""
    task_id, fields = found.task_id, found.fields
    if found.record is not None:
        try:
            return TaskStatus(task_id, states.SUCCESS, outcome.read(task_id, found.record))
        except TaskCancelled as exc:
            return TaskStatus(task_id, states.REVOKED, exc)
        except TaskFailed as exc:
            return _failed(exc, found.dlq)
    state, attempt = fields.get("state"), int(fields.get("attempt") or 1)
    reported = progress.load(fields.get("progress"))
    if state == "running" and reported is not None:  # its own state, its meta as .info
        return TaskStatus(task_id, reported.state, reported.meta)
    if state == "running":
        started = {"hostname": fields.get("worker"), "attempt": attempt,
                   "fence": int(fields.get("fence") or 0)}  # fmt: skip
        return TaskStatus(task_id, states.STARTED, started)
    if state is not None:
        # queued (or handed off, or leased for a resurrection): waiting for a start.
        # After a failed attempt that is Celery's RETRY; before any, PENDING.
        return TaskStatus(task_id, states.RETRY if attempt > 1 else states.PENDING)
    if found.dlq.get("reason"):  # the result expired; the DLQ entry is kept until released
        failed = TaskFailed(task_id, found.dlq["reason"], found.dlq.get("error") or None)
        return _failed(failed, found.dlq)
    return TaskStatus(task_id, states.PENDING, known=False)


def _failed(exc: TaskFailed, entry: dict[str, str]) -> TaskStatus:
    """FAILURE, with the traceback and time of the DLQ entry's failure when it has one."""
    body, at_ms = entry.get("entry"), entry.get("at_ms")
    trace = json.loads(body).get("traceback") if body else None
    done_ms = int(at_ms) if at_ms else None
    return TaskStatus(exc.task_id, states.FAILURE, exc, traceback=trace, done_ms=done_ms)
