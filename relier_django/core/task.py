"""``@rl_task``: a Celery task whose every message is a fenced, checksummed envelope."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from celery import Task, shared_task

from .model import config
from .model.idem_key import KeyOption
from .model.rates import Rate
from .model.schema import Migration, Schema
from .model.spec import TaskSpec
from .push import producer
from .push.producer import PushWith
from .store import bridge
from .store.receipt import Receipt
from .worker import signals
from .worker.runner import Runner


class RelierTask(Task):
    """The Celery task class behind every ``@rl_task``.

    Celery's own ``delay()`` and ``apply_async()`` would send the bare arguments and
    bypass the envelope, the fence and the stored copy; they raise and name ``push()``.
    """

    relier_spec: TaskSpec
    ignore_result = True
    serializer = "json"
    typing = False  # arguments are checked by push(); the Celery message carries one envelope

    def push(self, *args: Any, **kwargs: Any) -> Receipt:
        """Dispatch the task from sync code. Every argument goes to the task.

        Outside a transaction, once this returns the task is stored in Redis and
        handed to the broker (``receipt.dispatched``): it runs to a committed result
        or lands in the dead-letter queue.

        Inside ``transaction.atomic()`` on Django's default database, the arguments
        are checked now and the receipt (``receipt.pending``, with its ``task_id``)
        comes back at once; the store and the send happen when the transaction
        commits, and never if it rolls back. After the commit the receipt is
        ``dispatched``, ``deduplicated`` (idempotent tasks) or ``failed`` (the send
        gave up after retries: logged at ERROR with the envelope). For another
        database, or to send at once anyway, use :meth:`push_with`.

        Raises:
            TypeError: an argument does not fit the signature or is not JSON-serialisable.
            RuntimeError: called inside a running event loop (use ``apush``).
            AdmissionRejected: over a rate limit (only when sent at once).
            redis.exceptions.RedisError / kombu errors: nothing was dispatched (only
                when sent at once).
        """
        return producer.push(self.relier_spec, self.app, args, kwargs)

    async def apush(self, *args: Any, **kwargs: Any) -> Receipt:
        """Dispatch the task from async code; same guarantees as :meth:`push`.

        Async code has database connections of its own and cannot open ``atomic()``,
        so ``apush`` sends at once: no transaction of a sync caller reaches it. Push
        from the sync code that holds the transaction (e.g. inside the
        ``sync_to_async`` function) with ``push()`` to wait for its commit.
        """
        return await producer.apush(self.relier_spec, self.app, args, kwargs)

    def push_with(self, *, on_commit: bool = True, using: str | None = None) -> PushWith:
        """Options for one push, apart from the task's arguments (no parameter name of
        a task is reserved): ``task.push_with(using="orders").push(order_id)``.

        Args:
            on_commit: False sends at once, even inside a transaction.
            using: the database alias whose transaction the push waits for (default:
                Django's default database). An alias not in ``DATABASES`` raises at push.

        Raises:
            TypeError: an option of the wrong type.
            ValueError: ``using`` together with ``on_commit=False``.
        """
        return PushWith(self.relier_spec, self.app, on_commit=on_commit, using=using)

    def delay(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"{self.name} is an @rl_task: use {self.name.rsplit('.', 1)[-1]}.push(...) "
            "(or await .apush(...)); .delay() would bypass the envelope and its guarantees"
        )

    def apply_async(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"{self.name} is an @rl_task: use {self.name.rsplit('.', 1)[-1]}.push(...) "
            "(or await .apush(...)); .apply_async() would bypass the envelope and its guarantees"
        )


def _entry(self: RelierTask, *args: Any, **kwargs: Any) -> None:
    """The Celery task body, in the worker process: an ``async def`` task runs on the
    bridge loop, a plain ``def`` one in this (Celery's pool) thread."""
    runner = Runner(
        self.relier_spec,
        self.app,
        config.current(),
        signals.worker_id(self.request.hostname),
        queue=(self.request.delivery_info or {}).get("routing_key") or "",
    )
    if len(args) == 1 and not kwargs:
        if self.relier_spec.is_async:
            bridge.run(runner.run(args[0]))
        else:  # in this thread: no hop to the loop and on to another thread
            runner.run_blocking(args[0])
        return
    # Not sent by push(): keep what arrived rather than running it or dropping it.
    detail = (
        f"{self.name} received {len(args)} positional and {len(kwargs)} keyword arguments; "
        "@rl_task messages carry exactly one envelope (was it sent with send_task()?)"
    )
    bridge.run(runner.reject_malformed(detail, raw=repr({"args": args, "kwargs": kwargs})))


def rl_task(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    queue: str | None = None,
    idempotent: bool = False,
    idempotency_key: KeyOption = None,
    result_ttl: int | None = None,
    max_resurrections: int | None = None,
    retry_on: tuple[type[BaseException], ...] = (),
    max_retries: int | None = None,
    retry_backoff: float | None = None,
    retry_backoff_max: float | None = None,
    soft_timeout: float | None = None,
    hard_timeout: float | None = None,
    on_soft_timeout: Callable[..., Any] | None = None,
    rate_limit: str | None = None,
    version: int = 1,
    migrations: Mapping[int, Migration] | None = None,
) -> Any:
    """Declare a task that cannot be lost. Works on ``async def`` and plain ``def``.

    The task registers on the project's Celery app the way ``shared_task`` does, so
    ``autodiscover_tasks()`` finds it and a plain ``celery -A proj worker`` runs it.
    Declare a first parameter ``ctx: TaskContext`` (or named ``ctx``) to receive the
    incarnation's context.

    Args:
        name: the task name; default ``module.function``.
        queue: the queue to publish to; default: Celery's routing.
        idempotent: N pushes with one idempotency key run once; duplicates get the
            first task's id and result.
        idempotency_key: a string, or a callable of the task's arguments returning one;
            default: the canonical JSON of the arguments. Always namespaced by ``name``.
        result_ttl: seconds a committed result (and idempotency claim) is kept.
        max_resurrections: re-dispatches after worker deaths before the DLQ.
        retry_on: exception types that are retried as a new incarnation.
        max_retries: retries before the DLQ with reason ``retries_exhausted``.
        retry_backoff: base delay in seconds (exponential, with jitter).
        retry_backoff_max: cap on one delay, seconds.
        soft_timeout: seconds after an incarnation starts when ``on_soft_timeout(ctx)``
            runs (sync or async), while the task keeps running. ``async def`` only.
        hard_timeout: seconds after an incarnation starts when the task is cancelled
            (``CancelledError`` at its next ``await``; its ``finally`` blocks run) and
            goes to the DLQ with reason ``hard_timeout`` and its latest checkpoint.
            ``async def`` only. Each incarnation gets the full time again.
        on_soft_timeout: the soft-timeout hook, e.g. to save a checkpoint.
        rate_limit: admission control for pushes of this task, e.g. ``"100/s"`` (a
            fixed window): over it, ``push()`` raises ``AdmissionRejected`` with
            ``retry_after_s`` and nothing is stored or sent. The setting
            ``ADMISSION_TASK_LIMITS`` wins over it. Unlike Celery's own ``rate_limit``
            (which slows execution on each worker), this refuses work at the door.
        version: the schema version of the task's arguments, carried by every push.
            Bump it when the signature changes in a way old pushes do not fit.
        migrations: ``{from_version: fn(args, kwargs) -> (args, kwargs)}``, one step
            per version, an unbroken chain up to ``version``. A worker applies them in
            memory before running an older push; the stored envelope keeps its
            version. A push from a newer version, or one with no path, goes to the
            DLQ with reason ``schema_migration``. See docs/rolling-deploys.md.

    Raises:
        ValueError: timeouts on a plain ``def`` task, ``soft_timeout >= hard_timeout``,
            a non-positive timeout, ``on_soft_timeout`` without ``soft_timeout``, a
            ``rate_limit`` that is not a rate, a ``version`` below 1, or
            ``migrations`` keys outside ``1..version-1`` or with a hole.
        TypeError: a ``version`` that is not an int, or a migration that is not
            callable.
    """
    if idempotency_key is not None and not idempotent:
        raise ValueError("idempotency_key= only makes sense with idempotent=True")
    if not isinstance(retry_on, tuple) or not all(
        inspect.isclass(t) and issubclass(t, BaseException) for t in retry_on
    ):
        raise TypeError("retry_on must be a tuple of exception classes, e.g. (TimeoutError,)")

    _check_timeouts(soft_timeout, hard_timeout, on_soft_timeout)
    own_rate = Rate.parse(rate_limit) if rate_limit is not None else None
    schema = Schema(version, migrations or {})

    def decorate(func: Callable[..., Any]) -> RelierTask:
        if not callable(func):
            raise TypeError(f"@rl_task decorates a function, not {func!r}")
        task_name = name or f"{func.__module__}.{func.__qualname__}"
        if (soft_timeout or hard_timeout) and not inspect.iscoroutinefunction(func):
            raise ValueError(
                f"{task_name}: soft_timeout/hard_timeout need an `async def` task. A plain "
                "def runs in a thread, which cannot be cancelled safely; make it `async def` "
                "(run blocking parts with `await asyncio.to_thread(...)`), or check your own "
                "deadline and call ctx.ensure_current() in its loop"
            )
        spec = TaskSpec(
            name=task_name, fn=func, queue=queue, idempotent=idempotent,
            idempotency_key=idempotency_key, result_ttl_s=result_ttl,
            max_resurrections=max_resurrections, retry_on=retry_on, max_retries=max_retries,
            retry_backoff_s=retry_backoff, retry_backoff_max_s=retry_backoff_max,
            soft_timeout_s=soft_timeout, hard_timeout_s=hard_timeout,
            on_soft_timeout=on_soft_timeout, rate_limit=own_rate, schema=schema,
        )  # fmt: skip
        signals.connect()
        body = _make_body(func)
        return shared_task(  # type: ignore[no-any-return]
            name=task_name, bind=True, base=RelierTask, relier_spec=spec
        )(body)

    if fn is not None:
        return decorate(fn)
    return decorate


def _check_timeouts(
    soft: float | None, hard: float | None, hook: Callable[..., Any] | None
) -> None:
    for label, value in (("soft_timeout", soft), ("hard_timeout", hard)):
        if value is not None and value <= 0:
            raise ValueError(f"{label} must be > 0 seconds, got {value!r}")
    if soft is not None and hard is not None and soft >= hard:
        raise ValueError(
            f"soft_timeout ({soft}) must be below hard_timeout ({hard}): the soft hook is "
            "the warning before the hard stop"
        )
    if hook is not None and soft is None:
        raise ValueError("on_soft_timeout= needs soft_timeout= (when should it run?)")
    if hook is not None and not callable(hook):
        raise TypeError(f"on_soft_timeout must be callable, got {hook!r}")


def _make_body(func: Callable[..., Any]) -> Callable[..., None]:
    # Celery names the generated class and reads the docstring from the body function.
    def body(self: RelierTask, *args: Any, **kwargs: Any) -> None:
        _entry(self, *args, **kwargs)

    body.__name__ = func.__name__
    body.__qualname__ = func.__qualname__
    body.__module__ = func.__module__
    body.__doc__ = func.__doc__
    return body
