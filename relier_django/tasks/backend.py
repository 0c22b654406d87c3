"""The ``django.tasks`` backend's implementation; import it as
``relier_django.tasks.RelierBackend`` (see ``relier_django/tasks.py``)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from celery import signals as celery_signals
from django.conf import settings
from django.core import checks
from django.db import transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from ..core.model import config, events, resurrections
from ..core.model.limits import check_call
from ..core.model.timing import NOW, timing
from ..core.push import producer
from ..core.store import snapshot
from ..core.store.connection import async_client, sync_client
from ..core.store.keys import KeySpace
from ..core.store.receipt import Receipt
from ..core.task import rl_task

try:
    from django.tasks import TaskResultStatus
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import DEFAULT_TASK_QUEUE_NAME, Task, TaskContext, TaskError, TaskResult
    from django.tasks.exceptions import TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
except ImportError:
    # Django 5.2: the same names from the django-tasks backport (tasks.py checked that
    # one of the two is installed before importing this module).
    from django_tasks import TaskResultStatus
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import (
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskError,
        TaskResult,
    )
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import (
        task_enqueued,
        task_finished,
        task_started,
    )
    from django_tasks.utils import normalize_json


__all__ = ["ReliableTask", "RelierBackend"]

logger = logging.getLogger("relier_django.tasks")

_OPTIONS = frozenset({"USING"})
# Where a task that did not say why it failed points TaskError.exception_class_path.
_FAILED = "relier_django.core.model.errors.TaskFailed"
_CANCELLED = "relier_django.core.model.errors.TaskCancelled"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReliableTask(Task):
    """Django's ``Task`` with relier's options, as ``@task(...)`` gives them (each as
    ``@rl_task`` documents it; ``None``: the setting in force).

    Attributes:
        idempotent: N enqueues with one idempotency key run once; duplicates get the
            first task's result.
        idempotency_key: a string, or a callable of the task's arguments; default:
            the canonical JSON of the arguments.
        result_ttl: seconds a finished task's result (and ``TaskResult``) is kept.
        max_resurrections: re-runs after worker deaths before the DLQ; an integer, or
            limits by cause of death (``{"oom": 0, "default": 3}``).
        retry_on: exception types retried as a new incarnation.
        max_retries: retries before the DLQ (reason ``retries_exhausted``).
        retry_backoff: base delay of a retry, seconds (exponential, with jitter).
        retry_backoff_max: cap on one retry's delay, seconds.
        soft_timeout: seconds into an incarnation when a ``def`` task gets Celery's
            ``SoftTimeLimitExceeded`` (prefork pool).
        hard_timeout: seconds into an incarnation when it is stopped and filed in the
            DLQ (reason ``hard_timeout``).
        admission_limit: e.g. ``"100/s"``: over it, ``enqueue`` raises
            ``AdmissionRejected`` and nothing is stored or sent.
        concurrency, concurrency_key, limit, rate: flow control, as ``@rl_task``'s
            (docs/flow-control.md).
        call_limit, call_concurrency_key: one enqueue's own named limit and key, set by
            :meth:`using` (``using(limit=..., concurrency_key=...)``), as
            ``push_with``'s; not options of the task.
    """

    idempotent: bool = False
    idempotency_key: Any = None
    result_ttl: int | None = None
    # A mapping is kept as a ResurrectionPolicy: a Task is a frozen dataclass, hashed
    # by its fields, and a dict is not hashable.
    max_resurrections: int | Mapping[str, int] | resurrections.ResurrectionPolicy | None = None
    retry_on: tuple[type[BaseException], ...] = ()
    max_retries: int | None = None
    retry_backoff: float | None = None
    retry_backoff_max: float | None = None
    soft_timeout: float | None = None
    hard_timeout: float | None = None
    admission_limit: str | None = None
    concurrency: int | None = None
    concurrency_key: Any = None
    limit: str | None = None
    rate: str | None = None
    call_limit: str | None = None
    call_concurrency_key: str | int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_resurrections, Mapping):
            checked = resurrections.option(self.max_resurrections, "@task(max_resurrections=...)")
            object.__setattr__(self, "max_resurrections", checked)
        Task.__post_init__(self)  # the backend validates it (slots: no bare super())
        check_call(self.call_limit, self.call_concurrency_key, f"{self.module_path}.using()")
        _declare(self)

    def using(
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: Any = None,
        backend: str | None = None,
        limit: str | None = None,
        concurrency_key: str | int | None = None,
    ) -> ReliableTask:
        """Django's ``Task.using``, and this enqueue's own flow control: ``limit``, a
        ``RELIER["LIMITS"]`` name taken instead of the task's own limits, and
        ``concurrency_key``, its key itself (docs/flow-control.md, "Per call").

        Raises:
            TypeError, ValueError: a limit or key that cannot name one.
        """
        task: ReliableTask = Task.using(  # slots: no bare super()
            self, priority=priority, queue_name=queue_name, run_after=run_after, backend=backend
        )
        changes: dict[str, Any] = {}
        if limit is not None:
            changes["call_limit"] = limit
        if concurrency_key is not None:
            changes["call_concurrency_key"] = concurrency_key
        return dataclasses.replace(task, **changes) if changes else task


# The relier options of a plain Task (one built directly, or by another backend's
# task_class): every one at its default.
_DJANGO_FIELDS = {f.name for f in dataclasses.fields(Task)}
_CALL_FIELDS = {"call_limit", "call_concurrency_key"}  # one enqueue's, not the task's
_RELIER_OPTIONS = tuple(
    f.name
    for f in dataclasses.fields(ReliableTask)
    if f.name not in _DJANGO_FIELDS and f.name not in _CALL_FIELDS
)

_declared: dict[str, tuple[Any, Any]] = {}  # module path -> (Django task, Celery task)
_declaring = threading.Lock()


def _declare(task: Any) -> Any:
    """The ``@rl_task`` that runs ``task`` (declared once per module path)."""
    name = task.module_path
    found = _declared.get(name)
    if found is not None:
        return found[1]
    with _declaring:
        found = _declared.get(name)
        if found is not None:
            return found[1]
        options: dict[str, Any] = {o: getattr(task, o, None) for o in _RELIER_OPTIONS}
        options["idempotent"] = bool(options["idempotent"])
        options["retry_on"] = tuple(options["retry_on"] or ())
        celery_task = rl_task(
            name=name,
            bind=True,  # the incarnation's context comes first, whatever the task's names
            keep_trail=True,  # a finished task's TaskResult shows its arguments and attempts
            idempotent=options["idempotent"],
            idempotency_key=options["idempotency_key"],
            result_ttl=options["result_ttl"],
            max_resurrections=options["max_resurrections"],
            retry_on=options["retry_on"],
            max_retries=options["max_retries"],
            retry_backoff=options["retry_backoff"],
            retry_backoff_max=options["retry_backoff_max"],
            soft_timeout=options["soft_timeout"],
            hard_timeout=options["hard_timeout"],
            admission_limit=options["admission_limit"],
            concurrency=options["concurrency"],
            concurrency_key=options["concurrency_key"],
            limit=options["limit"],
            rate=options["rate"],
        )(_body(task))
        _declared[name] = (task, celery_task)
        _connect()
        return celery_task


def _body(task: Any) -> Callable[..., Any]:
    """The function the worker runs: sends ``task_started``, passes Django's
    ``TaskContext`` when the task takes it, and returns the value as Django keeps it
    (``normalize_json``: a tuple becomes a list)."""
    func = task.func
    params = list(inspect.signature(func).parameters.values())[1 if task.takes_context else 0 :]
    incarnation = inspect.Parameter("relier_ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD)

    if inspect.iscoroutinefunction(func):

        async def run_async(relier_ctx: Any, *args: Any, **kwargs: Any) -> Any:
            backend = task.get_backend()
            try:
                started = await backend.aget_result(relier_ctx.task_id)
            except TaskResultDoesNotExist:  # run in-process (eager mode): nothing stored
                started = _unstored(task, relier_ctx, args, kwargs)
            return normalize_json(await func(*_started(task, started), *args, **kwargs))

        run: Callable[..., Any] = run_async
    else:

        def run_sync(relier_ctx: Any, *args: Any, **kwargs: Any) -> Any:
            backend = task.get_backend()
            try:
                started = backend.get_result(relier_ctx.task_id)
            except TaskResultDoesNotExist:  # run in-process (eager mode): nothing stored
                started = _unstored(task, relier_ctx, args, kwargs)
            return normalize_json(func(*_started(task, started), *args, **kwargs))

        run = run_sync
    run.__signature__ = inspect.Signature([incarnation, *params])  # type: ignore[attr-defined]
    run.__name__, run.__qualname__ = func.__name__, func.__qualname__
    run.__module__, run.__doc__ = func.__module__, func.__doc__
    return run


def _started(task: Any, started: Any) -> list[Any]:
    """Send ``task_started``; the leading argument the task takes (its context), if any."""
    task_started.send(sender=type(task.get_backend()), task_result=started)
    return [TaskContext(task_result=started)] if task.takes_context else []


def _unstored(task: Any, relier_ctx: Any, args: Any, kwargs: Any) -> Any:
    """The RUNNING ``TaskResult`` of an incarnation the store knows nothing of (relier's
    eager mode runs the task in the caller's process and stores nothing)."""
    now = timezone.now()
    return TaskResult(
        task=task, id=relier_ctx.task_id, status=TaskResultStatus.RUNNING,
        enqueued_at=now, started_at=now, finished_at=None, last_attempted_at=now,
        args=list(args), kwargs=dict(kwargs), backend=task.backend, errors=[],
        worker_ids=[relier_ctx.worker] * max(1, int(relier_ctx.attempt)),
    )  # fmt: skip


def _django_task(name: str) -> Any:
    """The Django task declared under ``name`` (importing its module if this process
    has not), or None when ``name`` is not one."""
    found = _declared.get(name)
    if found is not None:
        return found[0]
    try:
        candidate = import_string(name)
    except ImportError:
        return None
    return candidate if isinstance(candidate, Task) else None


# -- task_finished: once the outcome is settled, in the process that settled it --------
_connected = False


def _connect() -> None:
    global _connected
    if _connected:
        return
    _connected = True
    celery_signals.task_success.connect(_on_success, weak=False, dispatch_uid="relier.tasks")
    events.subscribe(_on_event)


def _finished(task_id: str, name: str) -> None:
    task = _django_task(name)
    if task is None:
        return
    backend = task.get_backend()
    try:
        result = backend.get_result(task_id)
    except TaskResultDoesNotExist:
        return
    task_finished.send(sender=type(backend), task_result=result)


def _on_success(sender: Any = None, **_: Any) -> None:
    # Celery's task_success follows relier's commit (core/task.py's _entry), once.
    name = getattr(sender, "name", "")
    if name in _declared:
        _finished(sender.request.id, name)


def _on_event(event: object) -> None:
    # Any process that files a Django task (a worker, the scanner of manage.py
    # relier_resurrector, which may not have imported the task's module yet).
    if isinstance(event, events.TaskDeadLettered) and event.task and event.fence is not None:
        _finished(event.task_id, event.task)


def _flow(task: Any) -> tuple[str | None, str | None]:
    """One enqueue's own flow control (``ReliableTask.using(limit=, concurrency_key=)``);
    (None, None) for a plain ``Task`` or none given."""
    key = getattr(task, "call_concurrency_key", None)
    return getattr(task, "call_limit", None), None if key is None else str(key)


def celery_priority(priority: int) -> int:
    """django.tasks' priority (-100..100, higher first) on relier's 0..9 (9 first): ten
    equal bands, in order, so a higher django.tasks priority is never taken after a
    lower one. Django's default 0 is 4; -100 is 0 and 100 is 9."""
    return min(9, max(0, (priority + 100) * 10 // 201))


class RelierBackend(BaseTaskBackend):
    """A ``django.tasks`` backend that runs tasks on Celery workers with relier's
    guarantees: see the module docstring."""

    task_class = ReliableTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.using: str | None = self.options.get("USING")

    # -- enqueue ---------------------------------------------------------------------
    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Store and send the task (at the commit, inside ``atomic()``); its READY
        ``TaskResult``. An idempotent duplicate gets the first task's result."""
        self.validate_task(task)
        celery_task = _declare(task)
        receipt = producer.push(
            celery_task.relier_spec, celery_task.app, tuple(args), dict(kwargs),
            queue=self._queue(task), when=self._when(task), using=self.using,
            priority=celery_priority(task.priority), flow=_flow(task),
        )  # fmt: skip
        return self._enqueued(task, args, kwargs, receipt)

    async def aenqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Async twin of :meth:`enqueue` (sends at once: see ``producer.apush``)."""
        self.validate_task(task)
        celery_task = _declare(task)
        receipt = await producer.apush(
            celery_task.relier_spec, celery_task.app, tuple(args), dict(kwargs),
            queue=self._queue(task), when=self._when(task), using=self.using,
            priority=celery_priority(task.priority), flow=_flow(task),
        )  # fmt: skip
        if receipt.deduplicated:
            return await self.aget_result(receipt.duplicate_of or receipt.task_id)
        return self._enqueued(task, args, kwargs, receipt)

    def _enqueued(self, task: Any, args: Any, kwargs: Any, receipt: Receipt) -> Any:
        if receipt.deduplicated:
            return self.get_result(receipt.duplicate_of or receipt.task_id)
        result = TaskResult(
            task=task, id=receipt.task_id, status=TaskResultStatus.READY,
            enqueued_at=_when(receipt.created_ms) or timezone.now(),
            started_at=None, finished_at=None,
            last_attempted_at=None, args=list(args), kwargs=dict(kwargs),
            backend=self.alias, errors=[], worker_ids=[],
        )  # fmt: skip
        if not receipt.pending:
            task_enqueued.send(sender=type(self), task_result=result)
            return result

        def at_commit() -> None:  # after push's own callback: the receipt is settled
            if receipt.dispatched:
                task_enqueued.send(sender=type(self), task_result=result)
            elif receipt.deduplicated:
                task_enqueued.send(
                    sender=type(self),
                    task_result=self.get_result(receipt.duplicate_of or receipt.task_id),
                )

        transaction.on_commit(at_commit, using=self.using)
        return result

    @staticmethod
    def _queue(task: Any) -> str | None:
        # Django's default queue is Celery's default queue (routing decides).
        return None if task.queue_name == DEFAULT_TASK_QUEUE_NAME else task.queue_name

    @staticmethod
    def _when(task: Any) -> Any:
        run_after = task.run_after
        if run_after is None:
            return NOW
        if timezone.is_naive(run_after):  # only with USE_TZ = False (Django checks)
            run_after = timezone.make_aware(run_after)
        return timing(eta=run_after)

    # -- results ---------------------------------------------------------------------
    def get_result(self, result_id: str) -> Any:
        """The task's ``TaskResult`` from the store, from any process.

        Raises:
            TaskResultDoesNotExist: no django.tasks task has this id (never enqueued,
                its result expired, or another kind of task).
        """
        cfg = config.current()
        return self._result(snapshot.read(sync_client(cfg), KeySpace.of(cfg), str(result_id)))

    async def aget_result(self, result_id: str) -> Any:
        """Async twin of :meth:`get_result`."""
        cfg = config.current()
        found = await snapshot.aread(async_client(cfg), KeySpace.of(cfg), str(result_id))
        return self._result(found)

    def _result(self, told: snapshot.Snapshot) -> Any:
        envelope = told.envelope
        task = _django_task(str(envelope.get("task", ""))) if envelope else None
        if envelope is None or task is None:
            raise TaskResultDoesNotExist(f"no django.tasks task has the id {told.task_id!r}")
        starts = [e for e in told.history if e.get("event") == "start"]
        status, value, errors, finished = self._outcome(told)
        # As enqueue() gave it: the producer's clock, which the envelope carries.
        created = envelope.get("created_ms") or told.fields.get("created_ms")
        # The options given to using() at enqueue, as stored: the queue, the due time.
        queue = str(envelope.get("queue") or "") or DEFAULT_TASK_QUEUE_NAME
        due = _when(told.fields.get("due_ms"))
        if queue != task.queue_name or due != task.run_after:
            task = task.using(queue_name=queue, run_after=due)
        result = TaskResult(
            task=task, id=told.task_id, status=status,
            enqueued_at=_when(created),
            started_at=_when(starts[0].get("at_ms")) if starts else None,
            finished_at=finished,
            last_attempted_at=_when(starts[-1].get("at_ms")) if starts else None,
            args=list(envelope.get("args") or []), kwargs=dict(envelope.get("kwargs") or {}),
            backend=self.alias, errors=errors,
            worker_ids=[str(e.get("worker", "")) for e in starts],
        )  # fmt: skip
        object.__setattr__(result, "_return_value", value)  # as Django's backends set it
        return result

    @staticmethod
    def _outcome(told: snapshot.Snapshot) -> tuple[Any, Any, list[Any], datetime | None]:
        """(status, return value, errors, finished at)."""
        if told.record is not None:
            data = json.loads(told.record)
            if data.get("status") == "ok":
                done = _when(told.fields.get("done_ms"))
                return TaskResultStatus.SUCCESSFUL, data.get("result"), [], done
            if data.get("status") in ("cancelled", "superseded"):
                error = TaskError(exception_class_path=_CANCELLED, traceback="cancelled")
                return TaskResultStatus.FAILED, None, [error], None
        if told.dlq:
            return TaskResultStatus.FAILED, None, [_error(told.dlq)], _when(told.dlq.get("at_ms"))
        if told.record is not None:  # dead-lettered, its entry released or deleted since
            data = json.loads(told.record)
            gone = {"reason": data.get("reason", ""), "error": data.get("error") or ""}
            return TaskResultStatus.FAILED, None, [_error(gone)], None
        if told.fields.get("state") == "running":
            return TaskResultStatus.RUNNING, None, [], None
        return TaskResultStatus.READY, None, [], None

    # -- checks ----------------------------------------------------------------------
    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Misconfiguration, reported by ``manage.py check``."""
        found: list[checks.CheckMessage] = list(super().check(**kwargs))
        where = f'TASKS["{self.alias}"]["OPTIONS"]'
        for unknown in sorted(set(self.options) - _OPTIONS):
            found.append(checks.Error(
                f"{where} has an unknown option {unknown!r}",
                hint=f"relier_django.tasks.RelierBackend takes: {', '.join(sorted(_OPTIONS))}",
                id="relier.E011",
            ))  # fmt: skip
        if self.using is not None and self.using not in settings.DATABASES:
            found.append(checks.Error(
                f'{where}["USING"] names {self.using!r}, which is not in DATABASES',
                hint="name the database whose transactions an enqueue waits for",
                id="relier.E012",
            ))  # fmt: skip
        return found


def _error(entry: dict[str, str]) -> Any:
    """The DLQ entry's failure as Django's ``TaskError``."""
    data = json.loads(entry.get("entry") or "{}")
    path = data.get("exc_path") or _FAILED
    trace = data.get("traceback") or (
        f"{entry.get('reason', 'failed')}: {entry.get('error') or ''}".rstrip(": ")
    )
    return TaskError(exception_class_path=path, traceback=trace)


def _when(ms: object) -> datetime | None:
    """A store time (ms since the epoch) as Django gives times: aware with USE_TZ."""
    if ms in (None, ""):
        return None
    at = datetime.fromtimestamp(int(str(ms)) / 1000, tz=UTC)
    return at if settings.USE_TZ else timezone.make_naive(at)
