"""Eager mode and intercepted pushes: a push run in this process, or handed to a test's
recorder, without touching Redis or the broker.

Celery users run their tests with ``CELERY_TASK_ALWAYS_EAGER``; relier honours it (and
its own ``EAGER`` setting): ``push()``/``apush()`` validate as always (``prepare``),
then run the task here, with what a real run would give the caller: idempotency (an
in-process registry of keys: a duplicate gets the first task's id and outcome, a
failure frees the key), ``retry_on`` retried inline up to ``max_retries`` (no sleep),
a result that comes out of JSON as it went in, and a failure that ``get()`` raises as
``TaskFailed``, as after a dead-letter, though nothing is filed anywhere. With
Celery's ``task_eager_propagates`` the task's exception propagates from the push, as
from Celery's eager ``apply()``. Inside a transaction the run waits for its commit,
as a real push waits to be sent, unless ``immediate`` (``EAGER_IMMEDIATE``): then it
runs at once, as Celery's ``task_always_eager`` does, for tests wrapped in a
transaction that never commits.

Decision: the task runs through its Celery task object (``app.tasks[name].run``, the
body ``@rl_task`` built, with a request naming the task id and attempt, as Celery's
``apply()`` pushes one), not through the worker's runner: the producer side never
imports the worker side, and the body is where ``@rl_task`` builds an in-memory
``TaskContext`` (``TaskContext.inline``). Admission limits, schema migrations (the
envelope is the worker's own version) and result TTLs do not apply.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery import states

from ..model import outcome, workflow
from ..model.config import Config
from ..model.envelope import Envelope
from ..model.errors import TaskFailed
from ..model.failure import Failure, Reason
from ..model.request import RetryRequest
from ..model.spec import TaskSpec
from ..store import event_loop, progress
from ..store.receipt import Dispatch, DispatchState, NotDispatched, Receipt

logger = logging.getLogger("relier_django.eager")

DeferHook = Callable[[str | None, Callable[[], None]], bool]
"""The producer's transaction hook (``producer.TransactionHook``)."""

Interceptor = Callable[[TaskSpec, Any, Envelope, Config], Receipt]
"""``interceptor(spec, app, envelope, config)``: takes a validated push instead of the
store and the broker, and returns its receipt (``relier_django.testing``)."""

_POLL_S = 0.005


@dataclass(frozen=True, slots=True)
class Mode:
    """How pushes run: ``eager`` in this process; ``propagates``: a failed task's
    exception is raised from the push, as Celery's ``task_eager_propagates``;
    ``immediate``: a push inside a transaction runs at once too, not at its commit."""

    eager: bool
    propagates: bool = False
    immediate: bool = False


_lock = threading.Lock()
_override: Mode | None = None
_interceptors: list[Interceptor] = []
# (key prefix, task name, idempotency key) -> the receipt of the task holding it.
_claims: dict[tuple[str, str, str], EagerReceipt] = {}


def override(pinned: Mode | None) -> None:
    """Pin the mode whatever the settings say (tests); ``None`` unpins."""
    global _override
    with _lock:
        _override = pinned


def mode(app: Any, cfg: Config) -> Mode:
    """The mode in force: pinned, else the ``EAGER`` setting or Celery's
    ``task_always_eager``, with Celery's ``task_eager_propagates``."""
    if _override is not None:
        return _override
    conf = getattr(app, "conf", None)
    eager = cfg.eager or cfg.eager_immediate or bool(getattr(conf, "task_always_eager", False))
    propagates = eager and bool(getattr(conf, "task_eager_propagates", False))
    return Mode(eager, propagates, cfg.eager_immediate)


def push_interceptor(interceptor: Interceptor) -> None:
    """Route every push to ``interceptor`` until it is popped; the newest one wins."""
    with _lock:
        _interceptors.append(interceptor)


def pop_interceptor(interceptor: Interceptor) -> None:
    """Stop routing pushes to ``interceptor``."""
    with _lock:
        _interceptors.remove(interceptor)


def forget() -> None:
    """Drop every idempotency claim eager runs made in this process (between tests)."""
    with _lock:
        _claims.clear()


class _Outcome:
    """The in-memory outcome record a receipt reads, set once."""

    __slots__ = ("done", "record")

    def __init__(self) -> None:
        self.record: str | None = None
        self.done = threading.Event()

    def set(self, record: str) -> None:
        self.record = record
        self.done.set()


class EagerReceipt(Receipt):
    """A :class:`Receipt` whose outcome is held in memory: a push run in this process,
    or captured by ``relier_django.testing`` (``pending`` until it is run)."""

    __slots__ = ("_outcome",)

    def __init__(
        self, task_id: str, deduplicated: bool, config: Config, held: _Outcome | None = None
    ) -> None:
        super().__init__(task_id, deduplicated, config)
        self._outcome = held or _Outcome()

    @property
    def eager(self) -> bool:
        """Always True: this push ran (or will run) in this process, not on a worker."""
        return True

    @property
    def done(self) -> bool:
        """True once the task has an outcome (a result or a failure)."""
        return self._outcome.done.is_set()

    @property
    def status(self) -> str:
        """Celery's name for where the task stands, from memory: ``PENDING`` until it
        ran (while it runs, the state it last reported with ``ctx.set_progress``), then
        ``SUCCESS`` or ``FAILURE`` (never read from the store)."""
        record = self._outcome.record
        if record is None:
            reported = progress.recall(self.duplicate_of or self.task_id)
            return str(states.PENDING) if reported is None else reported.state
        return str(states.SUCCESS if json.loads(record)["status"] == "ok" else states.FAILURE)

    @property
    def info(self) -> Any:
        """Celery's ``AsyncResult.info``, from memory: while the task runs, the meta it
        last reported (None before); then its result, or the ``TaskFailed`` ``get()``
        would raise."""
        record = self._outcome.record
        if record is None:
            reported = progress.recall(self.duplicate_of or self.task_id)
            return None if reported is None else reported.meta
        try:
            return self._read(record)
        except TaskFailed as exc:
            return exc

    async def ainfo(self) -> Any:
        """Async twin of :attr:`info`."""
        return self.info

    async def astatus(self) -> str:
        """Async twin of :attr:`status`."""
        return self.status

    def _record(self) -> str | None:
        if self.pending:
            raise NotDispatched(
                self.task_id,
                DispatchState.PENDING,
                "not run yet: it waits for its transaction to commit, or it was captured "
                "(run it with captured.run_all() or captured[i].run())",
            )
        return self._outcome.record

    def _read(self, record: str) -> Any:
        return outcome.read(self.duplicate_of or self.task_id, record)

    def get(self, timeout: float | None = None) -> Any:
        """The result, at once once the task ran. Raises as :meth:`Receipt.get` does:
        ``TaskFailed`` for a failed task (nothing is in any dead-letter queue),
        ``NotDispatched`` while pending, ``TimeoutError`` while a duplicate's first
        push is still running elsewhere in this process."""
        if event_loop.in_running_loop():
            raise RuntimeError(
                "receipt.get() would block the running event loop; use await receipt.aget()"
            )
        record = self._record()
        if record is None:
            if not self._outcome.done.wait(timeout):
                raise TimeoutError(f"task {self.task_id}: no outcome within {timeout}s")
            record = self._outcome.record
        assert record is not None
        return self._read(record)

    async def aget(self, timeout: float | None = None) -> Any:  # noqa: ASYNC109 - mirrors get()
        """Async twin of :meth:`get`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (record := self._record()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"task {self.task_id}: no outcome within {timeout}s")
            await asyncio.sleep(_POLL_S)
        return self._read(record)

    def _follow(self, first: EagerReceipt) -> None:
        # An idempotent duplicate: this receipt now reads the first task's outcome.
        self._outcome = first._outcome
        self.settle(Dispatch(DispatchState.DEDUPLICATED, duplicate_of=first.task_id))


def divert(
    spec: TaskSpec, app: Any, env: Envelope, cfg: Config, hook: DeferHook | None, using: str | None
) -> Receipt | None:
    """Called by ``push()`` after validation: the receipt of a push intercepted or run
    eagerly, or ``None`` when it goes to Redis and the broker as usual.

    Raises:
        Exception: the task's own, when it failed and ``task_eager_propagates`` is on.
    """
    if _interceptors:
        return _interceptors[-1](spec, app, env, cfg)
    chosen = mode(app, cfg)
    if not chosen.eager:
        return None
    _refuse_chord(env)
    receipt = EagerReceipt.deferred(env.id, cfg)
    assert isinstance(receipt, EagerReceipt)
    run = functools.partial(_at_commit, spec, app, env, receipt, chosen.propagates)
    if hook is not None and not chosen.immediate and hook(using, run):
        logger.debug("eager run deferred to commit task=%s task_id=%s", env.task, env.id)
        return receipt
    return deliver(spec, app, env, receipt, chosen.propagates, now=True)


async def adivert(
    spec: TaskSpec, app: Any, env: Envelope, cfg: Config, hook: DeferHook | None, using: str | None
) -> Receipt | None:
    """:func:`divert` for ``apush()``: an ``async def`` task is awaited on the caller's
    loop, a plain ``def`` one runs in a thread (as on a worker), so the loop is free."""
    if _interceptors or not (chosen := mode(app, cfg)).eager:
        return divert(spec, app, env, cfg, hook, using)
    _refuse_chord(env)
    receipt = EagerReceipt.deferred(env.id, cfg)
    assert isinstance(receipt, EagerReceipt)
    run = functools.partial(_at_commit, spec, app, env, receipt, chosen.propagates)
    if hook is not None and not chosen.immediate and hook(using, run):
        logger.debug("eager run deferred to commit task=%s task_id=%s", env.task, env.id)
        return receipt
    if (duplicate := _begin(spec, env, receipt, now=True)) is not None:
        return duplicate
    attempt = 1
    while True:
        seen: list[Any] = []
        try:
            if spec.is_async:
                value = await _call(app, spec, env, attempt, seen)
            else:
                value = await asyncio.to_thread(_call, app, spec, env, attempt, seen)
        except Exception as exc:
            if _retries(spec, env, receipt.config, attempt, exc, _asked(seen)):
                attempt += 1
                continue
            _failed(spec, env, receipt, attempt, exc, _asked(seen))
            await asyncio.to_thread(_errbacks, app, env, receipt)
            if chosen.propagates:
                raise
            return receipt
        if _retries(spec, env, receipt.config, attempt, None, _asked(seen)):
            attempt += 1
            continue
        if _succeeded(spec, env, receipt, attempt, value):
            await asyncio.to_thread(_next_step, app, env, receipt, chosen.propagates, value)
        else:
            await asyncio.to_thread(_errbacks, app, env, receipt)
        return receipt


def deliver(
    spec: TaskSpec,
    app: Any,
    env: Envelope,
    receipt: EagerReceipt,
    propagates: bool = False,
    now: bool = False,
) -> EagerReceipt:
    """Run a push held by ``receipt`` (pending) now, in this thread, and settle it: its
    idempotency claim, its retries, its outcome. An ``async def`` task runs in a loop
    of its own (``asyncio.run``).

    Args:
        now: the push is being made (not delivered at a commit, or run from a
            capture): an idempotent duplicate gets a receipt of its own carrying the
            first task's id, as a push sent at once does.

    Returns:
        ``receipt``, or for ``now`` and a duplicate, the duplicate's receipt.

    Raises:
        Exception: the task's own, when it failed and ``propagates`` is True.
    """
    if (duplicate := _begin(spec, env, receipt, now)) is not None:
        return duplicate
    attempt = 1
    while True:
        seen: list[Any] = []
        try:
            value = _call(app, spec, env, attempt, seen)
            if inspect.isawaitable(value):
                value = asyncio.run(_awaited(value))
        except Exception as exc:
            if _retries(spec, env, receipt.config, attempt, exc, _asked(seen)):
                attempt += 1
                continue
            _failed(spec, env, receipt, attempt, exc, _asked(seen))
            _errbacks(app, env, receipt)
            if propagates:
                raise
            return receipt
        if _retries(spec, env, receipt.config, attempt, None, _asked(seen)):
            attempt += 1
            continue
        if _succeeded(spec, env, receipt, attempt, value):
            _next_step(app, env, receipt, propagates, value)
        else:
            _errbacks(app, env, receipt)
        return receipt


def _refuse_chord(env: Envelope) -> None:
    # Before anything runs: a chord later in a chain would stop it half-way.
    if workflow.holds_a_chord(env):
        raise TypeError(
            f"{env.task}: a chord member (or a chain with a group inside it) cannot run in "
            "RELIER['EAGER'] mode (its callback waits for a header kept in Redis); set "
            "CELERY_TASK_ALWAYS_EAGER instead, under which Celery runs the whole chord in "
            "this process"
        )


def _next_step(
    app: Any, env: Envelope, receipt: EagerReceipt, propagates: bool, value: Any
) -> None:
    """A chain step that succeeded runs its successor, and a task its callbacks
    (``link=``), as a worker's commit creates them."""
    now_ms = int(time.time() * 1000)
    nxt = workflow.successor(env, value, now_ms)
    for task in (*workflow.linked(env, value, now_ms), *([nxt] if nxt else [])):
        _run_created(app, task, receipt, propagates)


def _errbacks(app: Any, env: Envelope, receipt: EagerReceipt) -> None:
    """A task that failed runs its errbacks (``link_error=``), as its filing in the DLQ
    creates them; an errback's own failure does not hide the task's."""
    for errback, _ in workflow.errbacks(env, int(time.time() * 1000)):
        _run_created(app, errback, receipt, False)


def _run_created(app: Any, env: Envelope, receipt: EagerReceipt, propagates: bool) -> None:
    spec = getattr(app.tasks.get(env.task), "relier_spec", None)
    if not isinstance(spec, TaskSpec):
        raise TypeError(f"linked task {env.task!r} is not an @rl_task of this app")
    held = EagerReceipt.deferred(env.id, receipt.config)
    assert isinstance(held, EagerReceipt)
    deliver(spec, app, env, held, propagates, now=True)


def _at_commit(
    spec: TaskSpec, app: Any, env: Envelope, receipt: EagerReceipt, propagates: bool
) -> None:
    deliver(spec, app, env, receipt, propagates)


async def _awaited(value: Any) -> Any:
    return await value


def _call(app: Any, spec: TaskSpec, env: Envelope, attempt: int, seen: list[Any]) -> Any:
    """The task's body (``@rl_task``'s ``run``; a coroutine for an ``async def`` task),
    with a request as Celery's ``apply()`` gives one: the id, the retries so far. The
    body's context, when it takes one, is appended to ``seen``: its ``retry()``
    decides what comes next, as on a worker."""
    task = app.tasks[spec.name]
    task.push_request(
        id=env.id, args=list(env.args), kwargs=dict(env.kwargs), retries=attempt - 1,
        is_eager=True, delivery_info={"routing_key": env.queue, "is_eager": True},
        parent_id=env.parent or None, relier_expires_ms=env.expires_ms,
    )  # fmt: skip
    try:
        return task.run(*env.args, **env.kwargs)
    finally:
        ctx = getattr(getattr(task, "request", None), "_relier_ctx", None)
        if ctx is not None:
            seen.append(ctx)
        task.pop_request()


def _asked(seen: list[Any]) -> RetryRequest | None:
    """What the body's ``self.retry()`` decided, if it called it."""
    return getattr(seen[0], "_retry", None) if seen else None


def _retries(
    spec: TaskSpec, env: Envelope, cfg: Config, attempt: int, exc: Exception | None,
    asked: RetryRequest | None = None,
) -> bool:  # fmt: skip
    """True when the runner would retry: the body called ``self.retry()`` with retries
    left, or raised a ``retry_on`` exception with retries left. Eager retries do not
    wait for their countdown."""
    if asked is not None:
        retry = not asked.exhausted
        why = asked.error
    else:
        max_retries = spec.autoretry_max_retries(cfg.max_retries)
        retry = bool(spec.retry_on) and isinstance(exc, spec.retry_on) and attempt <= max_retries
        why = f"{type(exc).__name__}: {exc}"
    if retry:
        logger.debug("eager retry task_id=%s attempt=%s after %s", env.id, attempt + 1, why)
    return retry


def _begin(spec: TaskSpec, env: Envelope, receipt: EagerReceipt, now: bool) -> EagerReceipt | None:
    """Take the idempotency key and settle the receipt: None, the task runs; else the
    receipt of a duplicate, which reads the outcome of the task holding the key."""
    if (first := _claim(spec, env, receipt)) is None:
        receipt.settle(Dispatch(DispatchState.DISPATCHED))
        return None
    logger.debug("idempotent duplicate task=%s task_id=%s", env.task, first.task_id)
    if now:
        return EagerReceipt(first.task_id, True, receipt.config, first._outcome)
    receipt._follow(first)
    return receipt


def _claim(spec: TaskSpec, env: Envelope, receipt: EagerReceipt) -> EagerReceipt | None:
    """Take the idempotency key for ``receipt``; the receipt holding it, if another does."""
    if env.idem_key is None:
        return None
    key = (receipt.config.key_prefix, spec.name, env.idem_key)
    with _lock:
        first = _claims.setdefault(key, receipt)
    return None if first is receipt else first


def _succeeded(
    spec: TaskSpec, env: Envelope, receipt: EagerReceipt, attempts: int, value: Any
) -> bool:
    """Settle a run that returned ``value``; False when the value is not JSON or is
    larger than ``RESULT_MAX_BYTES`` (then it is a failure, as on a worker)."""
    try:
        record = outcome.succeeded(value, 1)
    except (TypeError, ValueError, RecursionError) as exc:  # as the runner's _record
        failure = Failure(
            Reason.RESULT_NOT_SERIALIZABLE, type(exc).__name__,
            f"the task returned a {type(value).__name__}, which is not JSON: {exc}",
        )  # fmt: skip
        _settle_failure(spec, env, receipt, attempts, failure)
        return False
    too_large = outcome.too_large(record, receipt.config.result_max_bytes)
    if too_large is not None:  # as the runner's _record: parity with a worker
        failure = Failure(Reason.RESULT_TOO_LARGE, "ResultTooLarge", too_large)
        _settle_failure(spec, env, receipt, attempts, failure)
        return False
    receipt._outcome.set(record)
    progress.forget(env.id)  # the outcome is what a reader sees from now on
    logger.debug("ran eagerly task=%s task_id=%s attempts=%s", env.task, env.id, attempts)
    return True


def _failed(
    spec: TaskSpec, env: Envelope, receipt: EagerReceipt, attempts: int, exc: Exception,
    asked: RetryRequest | None = None,
) -> None:  # fmt: skip
    # After self.retry() found no retries left, as on a worker: retries_exhausted.
    retryable = asked is not None or (bool(spec.retry_on) and isinstance(exc, spec.retry_on))
    reason = Reason.RETRIES_EXHAUSTED if retryable else Reason.EXCEPTION
    trace = "".join(traceback.format_exception(exc))
    _settle_failure(
        spec, env, receipt, attempts, Failure(reason, type(exc).__name__, str(exc), trace)
    )


def _settle_failure(
    spec: TaskSpec, env: Envelope, receipt: EagerReceipt, attempts: int, failure: Failure
) -> None:
    """A failure frees the idempotency key (as dead_letter.lua does); nothing is filed."""
    if env.idem_key is not None:
        key = (receipt.config.key_prefix, spec.name, env.idem_key)
        with _lock:
            if _claims.get(key) is receipt:
                del _claims[key]
    receipt._outcome.set(outcome.failed(failure.reason, failure.error, ""))
    progress.forget(env.id)
    logger.debug(
        "ran eagerly task=%s task_id=%s attempts=%s failed reason=%s error=%s\n%s",
        env.task, env.id, attempts, failure.reason, failure.error, failure.traceback or "",
    )  # fmt: skip
