"""What ``@rl_task`` knows about a task: its function and its options."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .idem_key import KeyOption
from .limits import TaskLimits
from .rates import Rate
from .request import DEFAULT_RETRY_DELAY_S
from .resurrections import ResurrectionPolicy
from .schema import Schema


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """A task's definition. ``None`` options fall back to the config in force."""

    name: str
    fn: Callable[..., Any]
    queue: str | None = None
    priority: int | None = None  # 0..9, 9 runs first; a push's own priority= wins
    idempotent: bool = False
    idempotency_key: KeyOption = None
    result_ttl_s: int | None = None
    # An integer, or limits by cause of death (model/resurrections.py).
    max_resurrections: int | ResurrectionPolicy | None = None
    retry_on: tuple[type[BaseException], ...] = ()
    max_retries: int | None = None
    retry_backoff_s: float | None = None
    retry_backoff_max_s: float | None = None
    retry_jitter: bool = True  # Celery's retry_jitter: jitter on retry_on's backoff
    # Celery's retry_kwargs: retry_on's own max_retries and fixed countdown (used when
    # no retry_backoff is given), e.g. {"max_retries": 5, "countdown": 10}.
    # Pairs, not a dict: a spec stays hashable (it keys caches).
    retry_kwargs: tuple[tuple[str, float], ...] = ()
    # Celery's default_retry_delay: a self.retry() without countdown or eta.
    default_retry_delay_s: float = DEFAULT_RETRY_DELAY_S
    soft_timeout_s: float | None = None  # async: on_soft_timeout runs; def: Celery's soft limit
    hard_timeout_s: float | None = None  # async: cancelled; def: killed; then the DLQ
    on_soft_timeout: Callable[..., Any] | None = None  # called with the TaskContext
    admission_limit: Rate | None = None  # push admission for this task (settings win)
    # The arguments' schema version and the migrations from older ones (@rl_task(version=)).
    schema: Schema = field(default_factory=Schema)
    bind: bool = False  # Celery's bind=True: the first parameter gets the context
    # After the commit, keep the task hash and history with the result (keys.trail):
    # django.tasks' TaskResult shows arguments, attempts and times of a finished task.
    keep_trail: bool = False
    # @rl_task(atomic=...): the database alias whose transaction the body runs in, with
    # the fenced inbox's row (relier_django.inbox); None: no transaction.
    atomic: str | None = None
    # Flow control (@rl_task(concurrency=, concurrency_key=, limit=, rate=)): the slots
    # and the rate its pushes go through (model/limits.py, docs/flow-control.md).
    limits: TaskLimits = field(default_factory=TaskLimits)

    # Worked out once at decoration: inspect.signature costs tens of microseconds, and
    # every push and every run needs it.
    _is_async: bool = field(init=False, repr=False, compare=False)
    _wants_context: bool = field(init=False, repr=False, compare=False)
    _user_signature: inspect.Signature = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        sig = inspect.signature(self.fn)
        params = list(sig.parameters.values())
        wants = bool(params) and (self.bind or _is_context(params[0]))
        object.__setattr__(self, "_is_async", inspect.iscoroutinefunction(self.fn))
        object.__setattr__(self, "_wants_context", wants)
        user = sig.replace(parameters=params[1:] if wants else params)
        object.__setattr__(self, "_user_signature", user)

    @property
    def is_async(self) -> bool:
        return self._is_async

    @property
    def wants_context(self) -> bool:
        """True when the first parameter is named ``ctx`` or annotated ``TaskContext``,
        or the task was declared with ``bind=True``."""
        return self._wants_context

    def autoretry_max_retries(self, default: int) -> int:
        """How many times ``retry_on`` retries: ``retry_kwargs["max_retries"]``, else
        ``max_retries``, else ``default`` (the config's)."""
        limit = dict(self.retry_kwargs).get("max_retries", self.max_retries)
        return default if limit is None else int(limit)

    @property
    def autoretry_countdown_s(self) -> float | None:
        """``retry_on``'s fixed delay (``retry_kwargs["countdown"]``) when no
        ``retry_backoff`` is given; ``None``: the exponential backoff."""
        if self.retry_backoff_s is not None:
            return None
        countdown = dict(self.retry_kwargs).get("countdown")
        return None if countdown is None else float(countdown)

    def user_signature(self) -> inspect.Signature:
        """The signature callers push against (without the injected context)."""
        return self._user_signature


def _is_context(first: inspect.Parameter) -> bool:
    annotation = first.annotation
    named = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return first.name == "ctx" or named.endswith("TaskContext")
