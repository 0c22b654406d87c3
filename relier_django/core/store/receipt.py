"""What ``push``/``apush`` return: the task id, whether (and how) it was dispatched,
and a way to wait for the outcome.

A push made inside a database transaction is deferred to its commit, so its receipt
starts ``pending`` and is settled, once, by the post-commit delivery
(``aftercommit.deliver``). Everything else about a receipt is fixed when it is made.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, cast

from ..model import outcome
from ..model.config import Config
from ..model.errors import RelierError
from . import bridge
from .connection import async_client, sync_client
from .keys import KeySpace

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
    """

    __slots__ = ("_config", "_dispatch", "_task_id")

    def __init__(self, task_id: str, deduplicated: bool, config: Config) -> None:
        self._task_id = task_id
        self._config = config
        self._dispatch = (
            Dispatch(DispatchState.DEDUPLICATED, duplicate_of=task_id)
            if deduplicated
            else _DISPATCHED
        )

    @classmethod
    def deferred(cls, task_id: str, config: Config) -> Receipt:
        """A receipt for a push waiting for its transaction to commit."""
        receipt = cls(task_id, False, config)
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
    def config(self) -> Config:
        return self._config

    @property
    def state(self) -> DispatchState:
        """``pending`` until the transaction commits (forever, if it rolls back),
        then ``dispatched``, ``deduplicated`` or ``failed``."""
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
    def failed(self) -> bool:
        """True when the post-commit send gave up (see :attr:`error`)."""
        return self._dispatch.state is DispatchState.FAILED

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
        return f"<Receipt {self._task_id} {self.state}{extra}>"

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
        return KeySpace(self.config.key_prefix).result(dispatch.duplicate_of or self._task_id)

    def get(self, timeout: float | None = None) -> Any:
        """Wait for the committed result (of the task holding the key, for a duplicate).

        Raises:
            TaskFailed: the task is in the dead-letter queue (reason and error attached).
            TimeoutError: no outcome within ``timeout`` seconds (the task may still run).
            NotDispatched: the push is pending or its post-commit send failed.
            RuntimeError: called inside a running event loop; use ``await receipt.aget()``.
        """
        if bridge.in_running_loop():
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
