"""``@rl_task``: a Celery task whose every message is a fenced, checksummed envelope."""

from __future__ import annotations

import concurrent.futures
import inspect
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from celery import Task, shared_task
from celery.exceptions import Ignore, Retry, SoftTimeLimitExceeded

from .broker import publish
from .model import config, resurrections
from .model import limits as limits_mod
from .model import options as options_mod
from .model.errors import TaskFailed
from .model.idem_key import KeyOption
from .model.rates import Rate
from .model.request import Request, RetryPolicy
from .model.schema import Migration, Schema
from .model.spec import TaskSpec
from .model.timing import debounce, timing
from .push import canvas, producer
from .push.producer import PushWith
from .store import event_loop, liveness
from .store.connection import sync_client
from .store.receipt import Receipt
from .worker import adoption, hooks
from .worker.context import TaskContext
from .worker.ending import Ended, Ending
from .worker.runner import Runner


class RelierTask(Task):
    """The Celery task class behind every ``@rl_task``.

    Celery's calls keep their meaning: ``delay()`` and ``apply_async()`` push (an
    envelope, stored and fenced, never the bare arguments), ``task(...)``, ``run()`` and
    ``apply()`` run the body in this process, and ``s()``/``si()`` build signatures whose
    ``apply_async`` pushes. What relier cannot honour yet raises and says so.
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

    def push_with(
        self,
        *,
        on_commit: bool = True,
        using: str | None = None,
        countdown: float | timedelta | None = None,
        eta: datetime | None = None,
        expires: float | timedelta | datetime | None = None,
        debounce_s: float | timedelta | None = None,
        debounce_key: str | None = None,
        priority: int | None = None,
        limit: str | None = None,
        concurrency_key: str | int | None = None,
    ) -> PushWith:
        """Options for one push, apart from the task's arguments (no parameter name of
        a task is reserved): ``task.push_with(using="orders").push(order_id)``.

        Args:
            on_commit: False sends at once, even inside a transaction.
            using: the database alias whose transaction the push waits for (default:
                Django's default database). An alias not in ``DATABASES`` raises at push.
            countdown: seconds (or a timedelta) from the push until the task is due,
                on the store's clock. The task waits in Redis, in no worker's memory,
                and the scanner leader dispatches it when due, once (docs/scheduling.md).
            eta: when the task is due, a timezone-aware datetime (wins over countdown).
                A time in the past dispatches at once.
            expires: seconds from the push, or an aware datetime: a task not started by
                then lands in the DLQ with reason ``expired``, never runs.
            debounce_s: a quiet window, seconds (or a timedelta): the task is due this
                long after the push, and a later debounced push of the same key within
                that wait supersedes it (trailing edge: of a burst, only the last push
                runs, once, with its arguments; a superseded one's ``get()`` raises
                ``TaskSuperseded``). A push after the waiting task was dispatched starts
                a new window (docs/flow-control.md, "Debounce").
            debounce_key: the key pushes are debounced under (default: the task's
                arguments); always within the task's own name.
            priority: 0 (lowest) to 9: of the messages waiting in one queue, a higher
                priority is taken first, on every broker (docs/priorities.md); default
                the task's ``@rl_task(priority=)``. Eager mode ignores it.
            limit: a ``RELIER["LIMITS"]`` name: this push takes that limit's slots and
                rate instead of the task's own ``concurrency=``/``limit=``/``rate=``
                (docs/flow-control.md, "Per call"). Kept by its retries, resurrections,
                DLQ release and outbox relay. Eager mode ignores it.
            concurrency_key: this push's key under its limit, the key itself (a str or
                an int), instead of the one the task's ``concurrency_key`` derives.

        Raises:
            TypeError: an option of the wrong type, a naive datetime, ``debounce_key``
                without ``debounce_s``.
            ValueError: ``using`` together with ``on_commit=False``; a negative countdown;
                a priority outside 0..9; a ``limit``/``concurrency_key`` that cannot
                name one (a limit the settings lack is a ``ConfigError`` at push);
                a due or expiry time outside 0001-01-02 .. 9999-12-31 UTC
                (``model.timing.LATEST_MS``); ``debounce_s`` with ``countdown`` or
                ``eta`` (the window is the countdown), or not above 0.
        """
        window = debounce(debounce_s, debounce_key)
        if window is not None and (countdown is not None or eta is not None):
            raise ValueError(
                f"{self.name}: debounce_s= is the task's countdown (it is due when its window "
                "is over): leave countdown= and eta= out"
            )
        if window is not None:
            countdown = timedelta(milliseconds=window.window_ms)
        when = timing(countdown, eta, expires)
        if priority is not None:
            priority = options_mod.check_priority(priority, "push_with(priority=...)")
        flow = limits_mod.check_call(limit, concurrency_key, f"{self.name}: push_with()")
        return PushWith(self.relier_spec, self.app, on_commit=on_commit, using=using, when=when,
                        debounce=window, priority=priority, flow=flow)  # fmt: skip

    def delay(self, *args: Any, **kwargs: Any) -> Receipt:
        """Celery's name for :meth:`push`, with the same guarantees."""
        return self.push(*args, **kwargs)

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Receipt:
        """Celery's ``apply_async``: a :meth:`push` with ``task_id=``, ``queue=``,
        ``countdown=``, ``eta=``, ``expires=``, ``priority=`` (0..9, 9 first, on
        every broker), and ``limit=``/``concurrency_key=`` (as :meth:`push_with`'s, so a
        beat entry's or a signature's ``options`` carry them too).

        ``link=`` (one ``@rl_task`` signature or a list) creates each callback with the
        commit, once, with the result as its first argument (not for an immutable
        ``.si()``); ``link_error=`` creates each errback when the task lands in the
        DLQ, once, with the failed task's id as its first argument (docs/workflows.md).
        Options relier cannot honour yet (custom ``headers``, ...) raise ``TypeError``
        naming the difference; a few that cannot matter here (``producer``, ``retry``,
        ``retry_policy``, ``ignore_result``, beat's header) are accepted. So a beat
        entry naming this task pushes it.

        Raises:
            InvalidTaskId: (a ``ValueError``) a ``task_id`` or ``group_id`` given here,
                or frozen into a chain's or chord's signature, that is not 1 to 64
                printable characters without whitespace (``model.ids``); nothing is
                stored.
        """
        lent = options.get("producer")  # a group's or chord's, held while it applies
        chosen = options_mod.call_options(options)
        when = timing(
            chosen.pop("countdown", None), chosen.pop("eta", None), chosen.pop("expires", None)
        )
        rest = canvas.rest(self.app, chosen.pop("chain", None) or ())
        link = [*rest.link, *canvas.linked(self.app, chosen.pop("link", None), errback=False)]
        link_error = canvas.linked(self.app, chosen.pop("link_error", None), errback=True)
        index, body = chosen.pop("group_index", None), chosen.pop("chord", None)
        chord = rest.chord  # a chain inside a chord's header: its last step's place
        if body is not None:
            if rest.steps:
                raise TypeError("a chain's place in a chord's header goes to its last step")
            chord = canvas.chord_place(self.app, chosen.get("group_id"), index, body)
        with publish.lending(lent):
            return producer.push(
                self.relier_spec, self.app, tuple(args or ()), dict(kwargs or {}), when=when,
                chain=rest.steps, chord=chord, position=index, link=link, link_error=link_error,
                **chosen,
            )  # fmt: skip

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # In a worker, Celery's tracer calls the task with the message's arguments (one
        # envelope); called from code, or by apply(), it is the body, run here.
        request = self.request
        if request.called_directly:
            return super().__call__(*args, **kwargs)
        if request.is_eager:
            return self.run(*args, **kwargs)
        return _entry(self, *args, **kwargs)

    def update_state(
        self,
        task_id: str | None = None,
        state: str | None = None,
        meta: Any = None,
        **kwargs: Any,
    ) -> None:
        """Refused on the task object (``current_task.update_state``, ``my_task.
        update_state``): it cannot reach the running incarnation's fence, so its
        progress could be a zombie's. A bound task's ``self`` is its ``TaskContext``,
        whose ``update_state`` stores it fenced (docs/progress.md).

        Raises:
            TypeError: always, naming the call to make instead.
        """
        raise TypeError(
            f"{self.name}: update_state() on the task object cannot be fenced; declare "
            "the task with bind=True and call self.update_state(...) there (self is its "
            "TaskContext), or ctx.set_progress(meta); pass ctx to helpers that report"
        )


def _entry(self: RelierTask, *args: Any, **kwargs: Any) -> Any:
    """The Celery task body, in the worker process: an ``async def`` task runs on the
    bridge loop, a plain ``def`` one in this (Celery's pool) thread.

    It ends the way relier settled the message, so Celery's state, signals, events and
    error trackers tell the truth: the committed result (SUCCESS, ``task_success``);
    the task's own exception, else ``TaskFailed``, once it is dead-lettered (FAILURE,
    ``task_failure``); ``Retry`` once the next incarnation is stored and sent by relier
    (RETRY, ``task_retry``; Celery publishes nothing for a raised ``Retry``); ``Ignore``
    for a copy that was not this worker's to run or finish, a stale or duplicate one
    (IGNORED: no result, no signal). Celery acknowledges the message for each of them,
    ``acks_late`` included, and never requeues it: relier already settled it.

    A message that is Celery's own (``send_task`` by name: arguments, no envelope) is
    adopted first, stored under its Celery id, then run the same way
    (``worker/adoption.py``).
    """
    runner = Runner(
        self.relier_spec,
        self.app,
        config.current(),
        hooks.worker_id(self.request.hostname),
        queue=(self.request.delivery_info or {}).get("routing_key") or "",
    )
    if adoption.is_plain(vars(self.request), args, kwargs):
        # send_task() by name: Celery's own message, adopted (worker/adoption.py).
        ended = _adopt_and_run(self, runner, args, kwargs)
    elif len(args) == 1 and not kwargs:
        ended = _run(self, runner, args[0])
    else:
        # Marked as relier's, yet not one envelope: keep what arrived, never run it.
        detail = (
            f"{self.name} received {len(args)} positional and {len(kwargs)} keyword "
            "arguments in a message marked as relier's, which carries exactly one envelope"
        )
        raw = repr({"args": args, "kwargs": kwargs})
        ended = event_loop.run(runner.reject_malformed(detail, raw=raw))
    if ended.how is Ending.COMMITTED:
        return ended.result
    if ended.how is Ending.RETRIED:
        raise Retry(exc=ended.error or ended.detail, when=ended.delay_s)
    if ended.how is Ending.DEAD:
        if ended.error is not None:
            raise ended.error  # its own traceback, for Celery's log and error trackers
        raise TaskFailed(ended.task_id or self.request.id, ended.reason or "", ended.detail)
    raise Ignore(ended.detail)


def _run(self: RelierTask, runner: Runner, raw: object) -> Ended:
    if self.relier_spec.is_async:
        return _wait(runner, event_loop.spawn(runner.run(raw)))
    return runner.run_blocking(raw)  # in this thread: no hop to the loop and back


def _adopt_and_run(
    self: RelierTask, runner: Runner, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Ended:
    """A plain message stored as a task under its Celery id (or found stored by its
    adoption at receipt, or by an earlier delivery), then run as a pushed one."""
    spec = self.relier_spec
    env = adoption.envelope_of(spec, self.request.id, args, kwargs, runner.queue)
    liveness.hold(runner.config, runner.worker)  # what it holds dies with its connection
    found = adoption.adopt(runner.config, spec, env, runner.worker).run(sync_client(runner.config))
    if not found.encoded:
        return Ended(Ending.REFUSED, self.request.id, detail=f"not adopted: {found.refusal}")
    return _run(self, runner, found.encoded)


def _wait(runner: Runner, running: concurrent.futures.Future[Ended]) -> Ended:
    """The ending of an ``async def`` incarnation on the bridge loop. A soft time limit
    Celery raises in this thread while it waits (a worker-wide ``--soft-time-limit``)
    stops the incarnation, which ends as a ``def`` task that let it escape would."""
    try:
        return running.result()
    except SoftTimeLimitExceeded as exc:
        runner.interrupt(exc)
        return running.result()


def rl_task(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    queue: str | None = None,
    idempotent: bool = False,
    idempotency_key: KeyOption = None,
    result_ttl: int | None = None,
    max_resurrections: int | Mapping[str, int] | None = None,
    retry_on: tuple[type[BaseException], ...] = (),
    max_retries: int | None = None,
    retry_backoff: float | None = None,
    retry_backoff_max: float | None = None,
    soft_timeout: float | None = None,
    hard_timeout: float | None = None,
    on_soft_timeout: Callable[..., Any] | None = None,
    admission_limit: str | None = None,
    version: int = 1,
    migrations: Mapping[int, Migration] | None = None,
    bind: bool = False,
    rate_limit: str | None = None,
    keep_trail: bool = False,
    atomic: bool | str = False,
    concurrency: int | None = None,
    concurrency_key: Any = None,
    limit: str | None = None,
    rate: str | None = None,
    priority: int | None = None,
    **celery_options: Any,
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
        max_resurrections: re-dispatches after worker deaths before the DLQ: an
            integer for every cause of death, or limits by cause, e.g.
            ``{"oom": 0, "default": 3}`` (an OOM-killed task goes to the DLQ at once,
            other deaths are resurrected up to 3 times); causes as
            docs/worker-death.md names them, ``"signal"``/``"exit"`` for every signal
            or exit code; a cause not named takes ``"default"``, else the setting.
        retry_on: exception types that are retried as a new incarnation.
        max_retries: retries before the DLQ with reason ``retries_exhausted``.
        retry_backoff: base delay in seconds (exponential, with jitter).
        retry_backoff_max: cap on one delay, seconds.
        soft_timeout: seconds after an incarnation starts when, for an ``async def``
            task, ``on_soft_timeout(ctx)`` runs (sync or async) while the task keeps
            running; for a plain ``def`` task, Celery's soft time limit raises
            ``SoftTimeLimitExceeded`` inside it (prefork pool). Celery's name:
            ``soft_time_limit``.
        hard_timeout: seconds after an incarnation starts when the task is stopped and
            goes to the DLQ with reason ``hard_timeout`` and its latest checkpoint: an
            ``async def`` task is cancelled (``CancelledError`` at its next ``await``;
            its ``finally`` blocks run), a plain ``def`` one is killed with its pool
            process by Celery's hard time limit (prefork pool). Each incarnation gets
            the full time again. Celery's name: ``time_limit``.
        on_soft_timeout: the soft-timeout hook of an ``async def`` task, e.g. to save a
            checkpoint.
        admission_limit: admission control for pushes of this task, e.g. ``"100/s"``
            (a fixed window): over it, ``push()`` raises ``AdmissionRejected`` with
            ``retry_after_s`` and nothing is stored or sent. The setting
            ``ADMISSION_TASK_LIMITS`` wins over it. Not Celery's ``rate_limit``, which
            is ``rate=`` here.
        priority: the default priority of its pushes, 0 (lowest) to 9 (taken first,
            on every broker: docs/priorities.md); a push's own ``priority=`` wins.
        version: the schema version of the task's arguments, carried by every push.
            Bump it when the signature changes in a way old pushes do not fit.
        migrations: ``{from_version: fn(args, kwargs) -> (args, kwargs)}``, one step
            per version, an unbroken chain up to ``version``. A worker applies them in
            memory before running an older push; the stored envelope keeps its
            version. A push from a newer version, or one with no path, goes to the
            DLQ with reason ``schema_migration``. See docs/rolling-deploys.md.
        bind: Celery's ``bind=True``: the first parameter, whatever its name, receives
            the incarnation's ``TaskContext`` (``self.request.id`` is ``ctx.task_id``).
        keep_trail: after the commit, keep the task's stored envelope and history with
            its result, for ``result_ttl``, instead of deleting them (what
            ``django.tasks``' ``TaskResult`` shows of a finished task: its arguments,
            attempts and times). Costs the envelope's size per task for that long.
        atomic: ``True`` (Django's default database) or a database alias: the body runs
            inside ``transaction.atomic()`` on it, together with a row of the fenced
            inbox recording the task's result. Its database writes then commit exactly
            once: a later incarnation that finds the row does not run the body and
            commits the recorded result; a zombie's transaction that would commit
            after another incarnation's is rolled back by the database itself. A plain
            ``def`` task only (Django's transactions are synchronous); the result must
            be JSON. See docs/transactions.md.
        concurrency: at most this many of the task's incarnations hold a slot at once,
            across every worker: from its dispatch to its commit, DLQ or cancel (a
            resurrected or retried incarnation keeps the slot). Over it, a task waits
            in Redis, in push order, and is dispatched by the script that frees a slot.
        concurrency_key: the name of one of the task's arguments, or a callable of its
            arguments returning a str or an int: each key gets its own
            ``concurrency`` slots (and its own ``rate``). With ``concurrency=1``, one
            key's tasks run one at a time in push order.
        limit: the name of a ``RELIER["LIMITS"]`` entry whose slots and rate this task
            shares with every other task naming it (with ``concurrency_key``, freed
            slots go to the keys in turn; ``"per_key": True`` gives each key its own).
        rate: dispatches per window across every worker, e.g. ``"100/s"`` (Celery's
            ``rate_limit=``, held cluster-wide instead of per worker): a task over it
            waits in the durable schedule for its turn, no worker held. Per key with
            ``concurrency_key``. See docs/flow-control.md.
        celery_options: Celery's names for the options above (``autoretry_for``,
            ``soft_time_limit``, ``time_limit``, ``retry_backoff=True``), and Celery
            options with nothing to do here (``acks_late``, ``ignore_result``, ...);
            see docs/from-celery.md.

    Raises:
        ValueError: ``on_soft_timeout`` on a plain ``def`` task, ``soft_timeout >= hard_timeout``,
            a non-positive timeout, ``on_soft_timeout`` without ``soft_timeout``, a
            ``rate_limit`` that is not a rate, a ``max_resurrections`` that is neither
            an integer >= 0 nor a mapping of causes to such, a ``version`` below 1, or
            ``migrations`` keys outside ``1..version-1`` or with a hole.
        TypeError: a ``version`` that is not an int, a migration that is not
            callable, an ``atomic`` that is neither a bool nor an alias, or
            ``atomic`` on an ``async def`` task.
    """
    ours: dict[str, Any] = {"soft_timeout": soft_timeout, "hard_timeout": hard_timeout,
                            "retry_on": retry_on, "retry_backoff": retry_backoff,
                            "retry_jitter": None, "retry_kwargs": None,
                            "default_retry_delay": None}  # fmt: skip
    for option, value in options_mod.translate(celery_options, _OWN_OPTIONS).items():
        if ours[option] not in (None, ()):
            raise TypeError(f"@rl_task got {option}= under two names (Celery's and relier's)")
        ours[option] = tuple(value) if option == "retry_on" else value
    soft_timeout, hard_timeout = ours["soft_timeout"], ours["hard_timeout"]
    retry_on, retry_backoff = ours["retry_on"], ours["retry_backoff"]
    # Celery's own retry options, under Celery's names only (docs/from-celery.md).
    celery_retry: dict[str, Any] = {
        "retry_jitter": ours["retry_jitter"] is not False,
        "retry_kwargs": tuple(sorted((ours["retry_kwargs"] or {}).items())),
    }
    if ours["default_retry_delay"] is not None:
        celery_retry["default_retry_delay_s"] = ours["default_retry_delay"]
    flow = limits_mod.check_options(
        concurrency, concurrency_key, limit, options_mod.execution_rate(rate, rate_limit)
    )
    if idempotency_key is not None and not idempotent:
        raise ValueError("idempotency_key= only makes sense with idempotent=True")
    if not isinstance(retry_on, tuple) or not all(
        inspect.isclass(t) and issubclass(t, BaseException) for t in retry_on
    ):
        raise TypeError("retry_on must be a tuple of exception classes, e.g. (TimeoutError,)")

    _check_timeouts(soft_timeout, hard_timeout, on_soft_timeout)
    own_rate = Rate.parse(admission_limit) if admission_limit is not None else None
    schema = Schema(version, migrations or {})
    if atomic is not False and atomic is not True and not (isinstance(atomic, str) and atomic):
        raise TypeError(f"atomic= takes True or a database alias (a str), got {atomic!r}")
    alias = "default" if atomic is True else (atomic or None)
    if priority is not None:
        priority = options_mod.check_priority(priority, "@rl_task(priority=...)")
    max_res = resurrections.option(max_resurrections, "@rl_task(max_resurrections=...)")

    def decorate(func: Callable[..., Any]) -> RelierTask:
        if not callable(func):
            raise TypeError(f"@rl_task decorates a function, not {func!r}")
        task_name = name or f"{func.__module__}.{func.__qualname__}"
        is_async = inspect.iscoroutinefunction(func)
        if on_soft_timeout is not None and not is_async:
            raise ValueError(
                f"{task_name}: on_soft_timeout= needs an `async def` task. In a plain def "
                "task, Celery's soft time limit raises SoftTimeLimitExceeded inside it at "
                "soft_timeout: catch it there to save a checkpoint"
            )
        if alias is not None and is_async:
            raise TypeError(
                f"{task_name}: atomic= needs a plain `def` task: Django's transactions are "
                "synchronous. Write the database part as a def function and call it with "
                "asgiref's sync_to_async inside relier_django.inbox.once(ctx)"
            )
        spec = TaskSpec(
            name=task_name, fn=func, queue=queue, priority=priority, idempotent=idempotent,
            idempotency_key=idempotency_key, result_ttl_s=result_ttl,
            max_resurrections=max_res, retry_on=retry_on, max_retries=max_retries,
            retry_backoff_s=retry_backoff, retry_backoff_max_s=retry_backoff_max,
            soft_timeout_s=soft_timeout, hard_timeout_s=hard_timeout,
            on_soft_timeout=on_soft_timeout, admission_limit=own_rate, schema=schema,
            bind=bind, keep_trail=keep_trail, atomic=alias, limits=flow, **celery_retry,
        )  # fmt: skip
        limits_mod.check_key_argument(flow, spec.user_signature(), task_name)
        hooks.connect()
        body = _make_body(func)
        # A def task's limits are Celery's own (prefork): soft raises inside the task,
        # hard kills the pool process; worker.hooks dead-letters it (hard_timeout).
        limits = {} if is_async else {"soft_time_limit": soft_timeout, "time_limit": hard_timeout}
        return shared_task(  # type: ignore[no-any-return]
            name=task_name, bind=True, base=RelierTask, relier_spec=spec, **limits
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


def _make_body(func: Callable[..., Any]) -> Callable[..., Any]:
    # Celery's run(): the task's own function, in this process, with a context of its
    # own when it takes one. Celery names the generated class after it and reads its
    # docstring.
    def body(self: RelierTask, *args: Any, **kwargs: Any) -> Any:
        spec = self.relier_spec
        if spec.wants_context:
            return func(_inline_context(self, spec, args, kwargs), *args, **kwargs)
        return func(*args, **kwargs)

    body.__name__ = func.__name__
    body.__qualname__ = func.__qualname__
    body.__module__ = func.__module__
    body.__doc__ = func.__doc__
    return body


def _inline_context(
    task: RelierTask, spec: TaskSpec, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> TaskContext:
    """The context of a body run in this process. ``apply()`` and eager runs carry an
    id and a retry count in Celery's request: the attempt, and the fence a worker's
    incarnation would hold (it grows with each retry); a direct call has neither."""
    request = task.request
    attempt = (request.retries or 0) + 1
    eager = bool(request.is_eager)
    policy = None
    if eager:  # a direct call's retry() raises at once: no policy to read
        limit = spec.max_retries if spec.max_retries is not None else config.current().max_retries
        policy = RetryPolicy(limit, spec.default_retry_delay_s)
    ctx = TaskContext.inline(
        spec.name, request.id, attempt, fence_token=attempt if eager else 0, retry_policy=policy
    )
    ctx._request = Request(
        ctx.task_id, spec.name, attempt - 1, args, kwargs,
        hostname=ctx.worker.rpartition(":")[0],
        queue=(request.delivery_info or {}).get("routing_key") or spec.queue or "",
        is_eager=eager, called_directly=bool(request.called_directly) and not eager,
        parent=str(request.parent_id or ""), expires_ms=getattr(request, "relier_expires_ms", None),
    )  # fmt: skip
    if eager:  # eager mode reads what the body's retry() decided from here (push/eager.py)
        request._relier_ctx = ctx
    return ctx


_OWN_OPTIONS = tuple(p for p in inspect.signature(rl_task).parameters if p != "celery_options")
