"""The tasks of the composition matrix (tests/composition/, docs/chaos.md, "The
composition matrix").

One body, declared twelve ways: plain or ``idempotent``, with or without the fenced
inbox (``atomic=True``), and with no flow control, ``concurrency=1`` per cell or a
``rate`` per cell (each keyed by the call's label, so one cell's tasks share a slot
or a rate and no cell waits for another's). What a task's first incarnation does is
one of its arguments (``first``), so a cell's fault travels with its call and an
idempotent duplicate carries the same one:

- ``""``: run and commit;
- ``"retry"``: raise :class:`Flaky` (in ``retry_on``) on the first attempt, then succeed;
- ``"fail"``: raise :class:`Broken` (not retried: the DLQ) at fence 1, a second after
  it started; a release runs it at a higher fence, which succeeds;
- ``"hold"``: sleep at fence 1, long enough for the test to SIGKILL the process (a pool
  process, or its whole worker); the next incarnation runs through;
- ``"oom"``: raise MemoryError at fence 1, a second after it started (as a process under
  ``RLIMIT_AS`` would): an ``oom`` death, which the tasks' ``{"oom": 0}`` sends to the
  DLQ at once; a release runs it at a higher fence, which succeeds.

Every run is noted first, in ``compose:run:<label>`` (task id, fence, attempt, PID, and
``first``), so the test finds the process to kill. The body's effect is made last and once per run
that gets there: ``compose:effect:<label>`` (task id and fence) in Redis, or, for the
inbox's tasks, a ``Booking`` row labelled ``<label>/<task id>`` in the inbox's
transaction. The test compares the effects with the commits: one effect per committed
task, made by the incarnation whose result was committed.
"""

from __future__ import annotations

import os
import time
from typing import Any

from relier_django import TaskContext, rl_task
from relier_django.core.model import config
from relier_django.core.store.connection import sync_client

HOLD_S = 60.0  # a held incarnation waits this long for its SIGKILL, then runs through
# A failing incarnation fails this long after it started: an idempotent call's key stays
# held meanwhile (a failure frees it), so a duplicate pushed just after meets it.
FAIL_AFTER_S = 1.0


class Flaky(Exception):
    """A failure the tasks retry (``retry_on``)."""


class Broken(Exception):
    """A failure they do not retry: the task lands in the DLQ with reason ``exception``."""


def run_key(label: str) -> str:
    return f"compose:run:{label}"


def effect_key(label: str) -> str:
    return f"compose:effect:{label}"


def booking_label(label: str, task_id: str) -> str:
    return f"{label}/{task_id}"


def _redis() -> Any:
    return sync_client(config.current())


def _begin(ctx: TaskContext, label: str, first: str) -> None:
    """Note the run, then do what the first incarnation was asked to."""
    note = f"{ctx.task_id}:{ctx.fence_token}:{ctx.attempt}:{os.getpid()}:{first}"
    _redis().rpush(run_key(label), note)
    if first == "retry" and ctx.attempt == 1:
        raise Flaky(f"{label}: attempt 1 fails, as asked")
    if first == "fail" and ctx.fence_token == 1:
        time.sleep(FAIL_AFTER_S)
        raise Broken(f"{label}: fence 1 fails, as asked")
    if first == "hold" and ctx.fence_token == 1:
        time.sleep(HOLD_S)
    if first == "oom" and ctx.fence_token == 1:
        time.sleep(FAIL_AFTER_S)
        raise MemoryError(f"{label}: fence 1 runs out of memory, as asked")


def _done(ctx: TaskContext, label: str, **extra: Any) -> dict[str, Any]:
    return {"label": label, "task_id": ctx.task_id, "fence": ctx.fence_token, **extra}


def _in_redis(ctx: TaskContext, label: str, first: str) -> dict[str, Any]:
    _begin(ctx, label, first)
    _redis().rpush(effect_key(label), f"{ctx.task_id}:{ctx.fence_token}")
    return _done(ctx, label)


def _in_database(ctx: TaskContext, label: str, first: str) -> dict[str, Any]:
    from testproject.demo.models import Booking

    _begin(ctx, label, first)  # inside the inbox's transaction: a kill rolls it back
    Booking.objects.create(label=booking_label(label, ctx.task_id), fence=ctx.fence_token)
    return _done(ctx, label)


_OPTIONS: dict[str, Any] = {
    "retry_on": (Flaky,),
    "max_retries": 2,
    "retry_backoff": 0.05,
    # Above what a cell does (one kill, or a whole-worker kill that can also take the
    # next incarnation): the resurrection limit is not what the matrix tests. An OOM
    # death goes to the DLQ at once (the "out of memory" fate).
    "max_resurrections": {"oom": 0, "default": 6},
}


@rl_task(name="compose.work", **_OPTIONS)
def work(ctx: TaskContext, label: str, first: str = "") -> dict[str, Any]:
    return _in_redis(ctx, label, first)


@rl_task(name="compose.work_idem", idempotent=True, **_OPTIONS)
def work_idem(ctx: TaskContext, label: str, first: str = "") -> dict[str, Any]:
    return _in_redis(ctx, label, first)


@rl_task(name="compose.work_atomic", atomic=True, **_OPTIONS)
def work_atomic(ctx: TaskContext, label: str, first: str = "") -> dict[str, Any]:
    return _in_database(ctx, label, first)


@rl_task(name="compose.work_idem_atomic", idempotent=True, atomic=True, **_OPTIONS)
def work_idem_atomic(ctx: TaskContext, label: str, first: str = "") -> dict[str, Any]:
    return _in_database(ctx, label, first)


# Flow control per cell (docs/flow-control.md): keyed by the label, so the cell's own
# task, its twin and its periodic ticks share one slot (one at a time, in push order)
# or one rate (the second of two pushes in a row waits for its turn).
FLOWS: dict[str, dict[str, Any]] = {
    "concurrency": {"concurrency": 1, "concurrency_key": "label"},
    "rate": {"rate": "1/s", "concurrency_key": "label"},
}


def _declare(idempotent: bool, atomic: bool, flow: str) -> Any:
    suffix = "".join(f"_{part}" for part in ("idem" * idempotent, "atomic" * atomic, flow) if part)

    def body(ctx: TaskContext, label: str, first: str = "") -> dict[str, Any]:
        return (_in_database if atomic else _in_redis)(ctx, label, first)

    body.__name__ = body.__qualname__ = f"work{suffix}"
    options = dict(_OPTIONS, **FLOWS[flow])
    return rl_task(name=f"compose.work{suffix}", idempotent=idempotent, atomic=atomic, **options)(
        body
    )


_DECLARED = {
    (False, False, ""): work,
    (True, False, ""): work_idem,
    (False, True, ""): work_atomic,
    (True, True, ""): work_idem_atomic,
} | {
    (idempotent, atomic, flow): _declare(idempotent, atomic, flow)
    for idempotent in (False, True)
    for atomic in (False, True)
    for flow in FLOWS
}


def declared(idempotent: bool, atomic: bool, flow: str) -> Any:
    """The task a cell with these values calls."""
    return _DECLARED[idempotent, atomic, flow]


# --- the other tasks of a cell's workflow: plain, no fault of their own ----------------


@rl_task(name="compose.neighbour")
def neighbour(ctx: TaskContext, label: str, position: int) -> dict[str, Any]:
    """A chain step or a group/chord member beside the cell's own task."""
    _redis().rpush(effect_key(label), f"{ctx.task_id}:{ctx.fence_token}")
    return _done(ctx, label, position=position)


@rl_task(name="compose.tail")
def tail(ctx: TaskContext, previous: Any, label: str) -> dict[str, Any]:
    """A chain's last step: returns the result the step before passed it."""
    _redis().rpush(effect_key(label), f"{ctx.task_id}:{ctx.fence_token}")
    return _done(ctx, label, previous=previous)


@rl_task(name="compose.collect")
def collect(ctx: TaskContext, results: list[Any], label: str) -> dict[str, Any]:
    """A chord's callback: returns the header's results it was given."""
    _redis().rpush(effect_key(label), f"{ctx.task_id}:{ctx.fence_token}")
    return _done(ctx, label, results=results)
