"""Celery's ``self.request`` for a relier incarnation, and what ``self.retry`` decided.
Pure; no I/O.

``Request`` gives Celery's field names their Celery meaning from what relier knows of
the incarnation (its envelope, its start). A Celery field relier cannot honour raises
``NotImplementedError`` naming what to use instead, the first time it is read: never an
``AttributeError``, which Celery code reading ``getattr(self.request, ...)`` would take
for a missing value and go on with a wrong one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

#: Celery's request fields relier cannot honour, and what to use instead.
UNSUPPORTED: Mapping[str, str] = {
    "callbacks": "link= callbacks ride in the envelope and are created by the commit; "
    "they are not readable here",
    "errbacks": "link_error= errbacks ride in the envelope and are created by the filing "
    "in the DLQ; they are not readable here",
    "chain": "a chain's next steps ride in the envelope and are created by the commit; "
    "root_id names the workflow",
    "headers": "relier messages carry one envelope and no custom headers; pass values "
    "as task arguments",
    "properties": "relier messages carry one envelope; delivery_info has the queue",
    "reply_to": "results are read from the store with the task id, not replied to",
    "origin": "the worker running the task is in hostname; the producer is not recorded",
    "timelimit": "the task's limits are @rl_task(soft_timeout=, hard_timeout=)",
    "time_limit": "the task's hard limit is @rl_task(hard_timeout=)",
    "soft_time_limit": "the task's soft limit is @rl_task(soft_timeout=)",
    "logfile": "configure logging with Django's LOGGING",
    "loglevel": "configure logging with Django's LOGGING",
    "shadow": "a task is logged under its own name",
    "ignore_result": "every outcome is kept for RESULT_TTL_S",
    "utc": "every time relier gives is timezone-aware UTC",
    "stamps": "relier messages are not stamped",
    "stamped_headers": "relier messages are not stamped",
    "replaced_task_nesting": "Task.replace is not supported",
}


@dataclass(frozen=True, slots=True)
class Request:
    """Celery's ``task.request`` for one incarnation: read-only, with Celery's names and
    meanings. A Celery field relier cannot honour (``headers``, ``callbacks``, ...)
    raises ``NotImplementedError`` naming the alternative.

    Attributes:
        id: the task id, stable across retries and resurrections.
        task: the task's name.
        retries: how many times this task was retried (``ctx.attempt - 1``); a
            resurrection after a worker died is not a retry.
        args: the positional arguments the body is called with.
        kwargs: the keyword arguments the body is called with.
        eta: when the task was due (countdown, eta, periodic tick), ISO 8601 in UTC, as
            Celery's worker gives it; ``None`` for a task pushed to run now.
        hostname: the name of the worker running this incarnation.
        delivery_info: ``{"routing_key": <queue>}`` (``"is_eager": True`` in eager mode).
        is_eager: True when run in this process by eager mode or ``apply()``.
        called_directly: True when the body was called as a function (``task(...)``).
        root_id: the id of the workflow's first task (a group's id for a group member);
            the task's own id outside a workflow.
        group: the id of the chord header this task is a member of; ``None`` outside a
            workflow. Raises for a step of a chain or a plain group, whose group relier
            does not record apart from ``root_id``.
        group_index: this task's place in its chord's header, or ``None``.
        chord: the id of the chord whose header this task is a member of, or ``None``.
        correlation_id: the task id, as Celery sets it.
        parent_id: the id of the task whose commit created this one (a chain's step
            before, the task a callback or errback is linked to, the header member whose
            commit completed a chord), else of the task whose body pushed it; ``None``
            for a push from outside a task's run, or by a release older than the field.
        expires: the push's ``expires=``, ISO 8601 in UTC, as the producer's clock put
            it (the store refuses a start after it, on its own clock); ``None`` when
            the push gave none. A started task runs to its outcome whatever the time.
        priority: the push's priority (0..9, 9 taken first), ``None`` when it gave none.
    """

    id: str
    task: str
    retries: int
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    scheduled_at: datetime | None = None
    hostname: str = ""
    queue: str = ""
    is_eager: bool = False
    called_directly: bool = False
    workflow: str = ""  # Envelope.workflow: the workflow's identity, "" outside one
    chord_member: Mapping[str, Any] = field(default_factory=dict)  # Envelope.chord
    priority: int | None = None
    parent: str = ""  # Envelope.parent
    expires_ms: int | None = None  # Envelope.expires_ms

    @property
    def parent_id(self) -> str | None:
        return self.parent or None

    @property
    def expires(self) -> str | None:
        if self.expires_ms is None:
            return None
        return datetime.fromtimestamp(self.expires_ms / 1000, tz=UTC).isoformat()

    @property
    def eta(self) -> str | None:
        return None if self.scheduled_at is None else self.scheduled_at.isoformat()

    @property
    def delivery_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"routing_key": self.queue}
        if self.is_eager:
            info["is_eager"] = True
        return info

    @property
    def root_id(self) -> str:
        return self.workflow or self.id

    @property
    def group(self) -> str | None:
        if self.chord_member:
            return str(self.chord_member.get("id"))
        if self.workflow:
            raise NotImplementedError(
                "self.request.group: relier does not record a chain step's or a plain "
                "group member's group apart from the workflow's identity; read "
                "self.request.root_id"
            )
        return None

    @property
    def taskset(self) -> str | None:  # Celery's old name for group
        return self.group

    @property
    def group_index(self) -> int | None:
        index = self.chord_member.get("index")
        return None if index is None else int(index)

    @property
    def chord(self) -> str | None:
        return str(self.chord_member["id"]) if self.chord_member else None

    @property
    def correlation_id(self) -> str:
        return self.id

    def get(self, key: str, default: Any = None) -> Any:
        """Celery's ``request.get(key, default)``: a field's value, ``default`` for a
        name Celery does not define either (a custom header, which relier never has).

        Raises:
            NotImplementedError: a Celery field relier cannot honour.
        """
        return getattr(self, key, default)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the class does not define.
        why = UNSUPPORTED.get(name)
        if why is None:
            raise AttributeError(name)
        raise NotImplementedError(f"self.request.{name} is not available in relier: {why}")


@dataclass(slots=True)
class RetryRequest:
    """What ``ctx.retry()`` decided, read by the runner (or eager mode) once the body
    ended: retry after ``delay_s``; or, ``exhausted``, the retries ran out and the
    exception that ends the body goes to the DLQ as ``retries_exhausted``."""

    delay_s: float = 0.0
    error: str = ""  # one line, for the history
    exc: Exception | None = None
    exhausted: bool = False


#: Celery's ``Task.default_retry_delay``: a ``self.retry()`` without ``countdown`` or
#: ``eta`` waits this long.
DEFAULT_RETRY_DELAY_S = 180.0


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The task's limits for ``self.retry()``: ``max_retries`` (``None``: no limit) and
    the delay of a retry given no ``countdown`` or ``eta``."""

    max_retries: int | None = 3
    default_delay_s: float = DEFAULT_RETRY_DELAY_S
