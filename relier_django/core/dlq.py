"""The dead-letter queue: where every task that cannot complete lands, with a reason.

This module holds the write (dead_letter.lua) and simple reads; the operator surface
(commands, admin, release) is built on top of it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import redis

from . import outcome, scripts
from .envelope import Envelope, canonical
from .fencing import Transition, history_tail, parse_transition
from .keys import KeySpace


class Reason(StrEnum):
    """Why a task is in the DLQ."""

    EXCEPTION = "exception"  # raised something not in retry_on
    RETRIES_EXHAUSTED = "retries_exhausted"  # raised a retry_on exception max_retries times
    HARD_TIMEOUT = "hard_timeout"
    RESURRECTION_LIMIT = "resurrection_limit"
    PAYLOAD_INTEGRITY = "payload_integrity"  # checksum (or signature) mismatch
    SCHEMA_MIGRATION = "schema_migration"  # envelope version this worker cannot read
    UNKNOWN_TASK = "unknown_task"  # no task of that name on the worker
    MALFORMED_MESSAGE = "malformed_message"  # not an envelope at all
    RESULT_NOT_SERIALIZABLE = "result_not_serializable"  # return value is not JSON


@dataclass(frozen=True, slots=True)
class Failure:
    """What is known about a failure, for the DLQ entry and for receipts."""

    reason: Reason
    exc_type: str | None = None
    exc_message: str | None = None
    traceback: str | None = None
    worker: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def error(self) -> str | None:
        if self.exc_type is None:
            return self.exc_message
        return f"{self.exc_type}: {self.exc_message}" if self.exc_message else self.exc_type


def _entry(task_id: str, entry_id: str, failure: Failure, env: Envelope | None, raw: object) -> str:
    body: dict[str, Any] = {
        "id": entry_id,
        "task_id": task_id,
        "reason": str(failure.reason),
        "exc_type": failure.exc_type,
        "exc_message": failure.exc_message,
        "traceback": failure.traceback,
        "worker": failure.worker,
        **failure.extra,
    }
    if env is not None:
        body.update(
            task=env.task,
            queue=env.queue,
            fence=env.fence,
            attempt=env.attempt,
            envelope=json.loads(env.encode()),
        )
    else:
        body["raw"] = raw if isinstance(raw, str) else repr(raw)
    return canonical(body)


def dead_letter(
    keys: KeySpace,
    failure: Failure,
    result_ttl_ms: int,
    *,
    env: Envelope | None,
    raw: object = None,
) -> scripts.ScriptCall[Transition]:
    """dead_letter.lua. With ``env`` the move is fenced to that incarnation and the
    task's working keys go with it; without, only the entry is written (a message
    that cannot be tied to a stored task keeps its raw body)."""
    entry_id = env.id if env is not None else f"msg-{uuid.uuid4()}"
    task_id = env.id if env is not None else entry_id
    idem = keys.idempotency(env.task, env.idem_key) if env is not None and env.idem_key else None
    tail = history_tail(
        "dead",
        fence=env.fence if env else None,
        reason=str(failure.reason),
        error=failure.error,
        worker=failure.worker,
    )
    return scripts.ScriptCall(
        scripts.DEAD_LETTER,
        keys.for_dead_letter(task_id, entry_id, idem),
        [
            task_id,
            str(env.fence) if env is not None else "",
            entry_id,
            _entry(task_id, entry_id, failure, env, raw),
            outcome.failed(str(failure.reason), failure.error, entry_id),
            result_ttl_ms,
            tail,
        ],
        parse_transition,
    )


@dataclass(frozen=True, slots=True)
class Entry:
    id: str
    at_ms: int
    data: dict[str, Any]
    history: list[dict[str, Any]]

    @property
    def reason(self) -> str:
        return str(self.data["reason"])

    @property
    def fence(self) -> int | None:
        """The failing incarnation's fence: tells this failure from a later one of the
        same task (None for a message that could not be tied to a task)."""
        fence = self.data.get("fence")
        return int(fence) if fence is not None else None


def get(client: redis.Redis, keys: KeySpace, entry_id: str) -> Entry | None:
    fields = client.hgetall(keys.dlq_entry(entry_id))
    if not fields:
        return None
    return Entry(
        entry_id, int(fields["at_ms"]), json.loads(fields["entry"]), json.loads(fields["history"])
    )


def recent(client: redis.Redis, keys: KeySpace, limit: int = 50) -> list[Entry]:
    """The newest entries first."""
    ids = client.zrevrange(keys.dlq, 0, limit - 1)
    return [e for e in (get(client, keys, i) for i in ids) if e is not None]


def size(client: redis.Redis, keys: KeySpace) -> int:
    return int(client.zcard(keys.dlq))
