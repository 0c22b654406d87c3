"""The fenced inbox: a task's database writes commit exactly once, whatever the deaths,
resurrections and zombies (docs/transactions.md).

A unit of work (a whole ``@rl_task(atomic=True)`` body, or the block of a
``with once(ctx) as unit:``) runs inside ``transaction.atomic()`` together with a row
of ``relier_inbox`` keyed by the task's identity (its id and its push's token:
``Envelope.identity``) and the unit's name, holding its result. A later task pushed
under the same caller-chosen id is another task: it finds no row of the earlier one. The
row's primary key is the fence inside the database: of all the incarnations that run
the unit, the database lets exactly one transaction that inserts it commit. Another
one, a zombie that resumes after its successor committed or a successor that ran
beside a slow predecessor, fails on the key and rolls its whole transaction back,
its writes with it. An incarnation that finds the row committed does not run the unit
again and takes the recorded result: the task's result in Redis is then that one.

What it cannot cover: writes to anything but this database (an HTTP call, an email, a
second database). Give those the stable key ``TaskContext.idempotency_key``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from django.db import DEFAULT_DB_ALIAS, IntegrityError, transaction

from ..core import crashpoint
from ..core.model.errors import TaskLost
from ..core.worker import atomic
from ..core.worker.context import TaskContext
from ..models import InboxEntry

logger = logging.getLogger("relier_django.inbox")


class Unit:
    """One unit of work of a task, run at most once to a commit. Use :func:`once`.

    Attributes:
        done: True when the unit's transaction committed, in this incarnation or an
            earlier one; inside the block, True means an earlier one did it and the
            block must not write again.
        result: what the unit recorded (JSON): set it inside the block; after the
            block it is the committed one, whichever incarnation committed it.
        fence: the fence token of the incarnation whose transaction committed.
    """

    def __init__(self, ctx: TaskContext, using: str | None, part: str) -> None:
        if not isinstance(ctx, TaskContext):
            raise TypeError(f"once() takes the task's TaskContext, got {ctx!r}")
        self.ctx, self.using, self.part = ctx, using or DEFAULT_DB_ALIAS, part
        # The task's identity, not its id alone: a caller-chosen id can be pushed again
        # once its outcome has expired (RESULT_TTL_S), while its rows live INBOX_KEEP_S.
        self.key = f"{ctx.identity or ctx.task_id}:{part}"
        self.done = False
        self.result: Any = None
        self.fence: int | None = None
        self._atomic: Any = None

    def _recorded(self) -> bool:
        row = InboxEntry.objects.using(self.using).filter(key=self.key).first()
        if row is None:
            return False
        self.done, self.result, self.fence = True, json.loads(row.result), row.fence
        return True

    def __enter__(self) -> Unit:
        connection = transaction.get_connection(self.using)
        if connection.in_atomic_block:
            # Its commit would be the outer block's: a zombie's rows could then commit
            # after the inbox row decided against them.
            raise RuntimeError(
                f"once() must open the outermost transaction on {self.using!r}; it was "
                "entered inside transaction.atomic()"
            )
        if self._recorded():
            logger.warning(
                "inbox: unit already committed, not run again task_id=%s unit=%r fence=%s "
                "committed_by_fence=%s",
                self.ctx.task_id, self.part, self.ctx.fence_token, self.fence,
            )  # fmt: skip
            return self
        self._atomic = transaction.atomic(using=self.using)
        self._atomic.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        block, self._atomic = self._atomic, None
        if block is None:  # recorded before: nothing was opened
            return False
        if exc is not None:
            return bool(block.__exit__(exc_type, exc, tb))
        try:
            self._record()
        except BaseException as error:
            block.__exit__(type(error), error, error.__traceback__)  # rolls it all back
            if isinstance(error, IntegrityError) and self._recorded():
                logger.warning(
                    "inbox: another incarnation committed this unit first; this one's "
                    "transaction rolled back task_id=%s unit=%r fence=%s committed_by_fence=%s",
                    self.ctx.task_id, self.part, self.ctx.fence_token, self.fence,
                )  # fmt: skip
                return False
            raise
        crashpoint.cross(crashpoint.BEFORE_INBOX_COMMIT, self.ctx.task_name, self.part)
        block.__exit__(None, None, None)  # the commit: the unit's writes and its row
        self.done, self.fence = True, self.ctx.fence_token
        crashpoint.cross(crashpoint.AFTER_INBOX_COMMIT, self.ctx.task_name, self.part)
        return False

    def _record(self) -> None:
        # A result that is not JSON fails here, inside the transaction: nothing commits.
        encoded = json.dumps(self.result, allow_nan=False, separators=(",", ":"))
        if not self.ctx.is_current():  # known superseded: no need to ask the database
            raise TaskLost(f"task {self.ctx.task_id}: fence {self.ctx.fence_token} superseded")
        # A savepoint: the key's conflict is then reported here, and the block's own
        # rollback above stays a clean one.
        with transaction.atomic(using=self.using):
            InboxEntry.objects.using(self.using).create(
                key=self.key, fence=self.ctx.fence_token, result=encoded,
                committed_ms=int(time.time() * 1000),
            )  # fmt: skip


def once(ctx: TaskContext, using: str | None = None, part: str = "") -> Unit:
    """A block of a task whose database writes commit exactly once::

        @rl_task
        def settle(ctx, order_id):
            with once(ctx) as unit:
                if not unit.done:  # False unless an earlier incarnation committed it
                    Payment.objects.create(order_id=order_id)
                    unit.result = {"paid": order_id}
            return unit.result  # the committed result, whoever committed it

    ``using``: the database alias (Django's default one when ``None``). ``part``: a
    name, for a task with several units. The block runs inside
    ``transaction.atomic(using)`` (it must be the outermost one): an exception rolls it
    back and is raised, as ``atomic()`` does.

    Guarantees: of every incarnation of the task (retries, resurrections, zombies),
    exactly one commits the block's transaction; the others' writes are rolled back
    (or never made, when they find ``unit.done``). Inbox rows are kept for
    ``INBOX_KEEP_S``.

    Raises:
        RuntimeError: entered inside an open ``atomic()`` block on ``using``.
        TaskLost: this incarnation is known to be superseded (rolled back).
        TypeError, ValueError: ``unit.result`` is not JSON (rolled back).
    """
    return Unit(ctx, using, part)


def run_atomic(alias: str, ctx: TaskContext, body: Callable[[], Any]) -> Any:
    """The core's ``AtomicRunner``: a whole ``@rl_task(atomic=...)`` body as one unit."""
    with once(ctx, using=alias) as unit:
        if not unit.done:
            unit.result = body()
    return unit.result


def install() -> None:
    """Called from ``AppConfig.ready()``: ``@rl_task(atomic=...)`` bodies run here."""
    atomic.install(run_atomic)
