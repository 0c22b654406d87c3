"""The send of a push deferred to a transaction's commit: store and publish it then,
retry for a bounded time, and if it still fails, log it at ERROR with its full
envelope so that it can be replayed.

It runs in the committing thread, inside the on_commit callback, which therefore
returns only once the task is dispatched or given up on. A background thread would
not hold up the commit, but it would carry a committed task that exists nowhere else
past the caller's return: a daemon thread dies with the interpreter (the task
vanishes at exit), and a non-daemon one holds the exit up by the same bound this
blocking does, without anyone waiting for it. Blocking means that once the
``atomic()`` block exits, the task is dispatched or an ERROR holds its envelope.
In an outage the committing thread waits up to :data:`SEND_BUDGET_S` (plus the last
attempt's own timeouts); in normal operation it costs what an immediate push costs.

What no retry can cover: the process dying between the database commit and the end of
this send (about a millisecond, or the budget in an outage). The transactional outbox
closes that window (``RELIER["OUTBOX"]``): the envelope was written into the producer's
own transaction, so the commit keeps it, and the scanner leader's relay sends any row
this send did not. With the outbox, this send tries once and never blocks the
committing thread on retries: a failure leaves the push to the relay (docs/transactions.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ..model.config import Config
from ..model.envelope import Envelope
from ..model.errors import AdmissionRejected, DuplicateTaskId
from ..store.connection import sync_client
from ..store.receipt import Dispatch, DispatchState, Receipt

logger = logging.getLogger("relier_django.producer")


class Deferred(Protocol):
    """What delivery needs of a push prepared before its transaction committed
    (``producer``'s push in progress): its envelope, and a way to store and send it."""

    @property
    def cfg(self) -> Config: ...

    @property
    def env(self) -> Envelope: ...

    @property
    def encoded(self) -> str: ...

    def send_now(self, app: Any, client: Any) -> Receipt: ...


# The whole time a post-commit send may take, retries included: long enough for a
# Redis restart or a broker blip, short enough that a request does not hang for long.
SEND_BUDGET_S = 5.0
_FIRST_PAUSE_S = 0.1
_MAX_PAUSE_S = 1.0


def deliver(
    p: Deferred,
    app: Any,
    receipt: Receipt,
    outbox: Sequence[Callable[[], None]] = (),
    *,
    budget_s: float = SEND_BUDGET_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Store and send a deferred push after its transaction committed; settle its receipt.

    Retries Redis and broker errors with exponential backoff, and an admission
    refusal after its ``retry_after_s``, as long as the next attempt starts within
    ``budget_s`` of the first. Never raises an ``Exception`` (the commit has happened;
    an exception here would only stop Django from running the other on_commit
    callbacks): giving up settles the receipt ``failed`` and logs the envelope at
    ERROR. A ``BaseException`` (``KeyboardInterrupt``, ``SystemExit``), even during a
    pause, is logged the same way, then re-raised.

    ``outbox``: the delete of the push's committed outbox row (empty: no outbox). With
    one, a single attempt is made; the row is deleted once the push is stored, and a
    failure settles the receipt ``outbox``: the relay sends the row (a WARNING, not an
    ERROR, since nothing needs a human).
    """
    if outbox:
        _deliver_once(p, app, receipt, outbox)
        return
    delivery = _Delivery(p, app, receipt, clock, sleep)
    try:
        delivery.run(clock() + budget_s)
    except BaseException as exc:
        if receipt.pending:
            _give_up(p, receipt, exc, delivery.attempt)
        raise


def _deliver_once(
    p: Deferred, app: Any, receipt: Receipt, outbox: Sequence[Callable[[], None]]
) -> None:
    try:
        sent = p.send_now(app, sync_client(p.cfg, fail_fast=True))
    except DuplicateTaskId as exc:  # final: the relay could do no better
        _give_up(p, receipt, exc, 1)
    except BaseException as exc:
        receipt.settle(Dispatch(DispatchState.OUTBOX, error=f"{type(exc).__name__}: {exc}"))
        logger.warning(
            "push after commit not sent yet, the outbox relay will send it task=%s "
            "task_id=%s reason=%s: %s",
            p.env.task, p.env.id, type(exc).__name__, exc,
        )  # fmt: skip
        if not isinstance(exc, Exception):
            raise
        return
    else:
        _settle(p, receipt, sent, 1)
    for delete in outbox:
        try:
            delete()
        except Exception:
            # Harmless: the relay finds the row, and push.lua answers "already stored".
            logger.warning(
                "could not delete the outbox row of task_id=%s; the relay will",
                p.env.id,
                exc_info=True,
            )


class _Delivery:
    """The attempts of one post-commit send; ``attempt`` counts them for the logs."""

    def __init__(
        self,
        p: Deferred,
        app: Any,
        receipt: Receipt,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> None:
        self.p, self.app, self.receipt = p, app, receipt
        self.clock, self.sleep = clock, sleep
        self.attempt = 0

    def run(self, deadline: float) -> None:
        p, receipt = self.p, self.receipt
        pause = _FIRST_PAUSE_S
        while True:
            self.attempt += 1
            try:
                # Fail-fast client: this loop owns the retries and their bound. push.lua
                # is safe to re-run after a lost reply (same envelope: no second store,
                # no second admission count).
                sent = p.send_now(self.app, sync_client(p.cfg, fail_fast=True))
            except DuplicateTaskId as exc:  # a caller-chosen id already taken: final
                _give_up(p, receipt, exc, self.attempt)
                return
            except AdmissionRejected as exc:
                error: Exception = exc
                wait = max(exc.retry_after_s, pause)
            except Exception as exc:
                error, wait = exc, pause
            else:
                _settle(p, receipt, sent, self.attempt)
                return
            if self.clock() + wait > deadline:
                _give_up(p, receipt, error, self.attempt)
                return
            logger.warning(
                "push after commit failed, retrying task=%s task_id=%s attempt=%d "
                "retry_in_s=%.2f reason=%s: %s",
                p.env.task, p.env.id, self.attempt, wait, type(error).__name__, error,
            )  # fmt: skip
            self.sleep(wait)
            pause = min(pause * 2, _MAX_PAUSE_S)


def _settle(p: Deferred, receipt: Receipt, sent: Receipt, attempt: int) -> None:
    if sent.deduplicated:
        receipt.settle(Dispatch(DispatchState.DEDUPLICATED, duplicate_of=sent.task_id))
    else:
        receipt.settle(Dispatch(DispatchState.DISPATCHED))
    if attempt > 1:
        logger.warning(
            "push after commit dispatched task=%s task_id=%s attempt=%d state=%s",
            p.env.task, p.env.id, attempt, receipt.dispatch_state,
        )  # fmt: skip


def _give_up(p: Deferred, receipt: Receipt, error: BaseException, attempt: int) -> None:
    receipt.settle(Dispatch(DispatchState.FAILED, error=f"{type(error).__name__}: {error}"))
    # ERROR: an operator must act. The envelope is the whole task (id, arguments,
    # checksum, signature): relier_django.transactions.replay(envelope) pushes it.
    logger.error(
        "push after commit NOT dispatched: the transaction committed but the task was "
        "not sent; replay its envelope with relier_django.transactions.replay() "
        "task=%s task_id=%s attempt=%d reason=%s envelope=%s",
        p.env.task, p.env.id, attempt, type(error).__name__, p.encoded,
        exc_info=(type(error), error, error.__traceback__),
    )  # fmt: skip
