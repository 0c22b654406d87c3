"""The dead-letter queue: where every task that cannot complete lands, with a reason.

This module holds the write (dead_letter.lua) and the shape of an entry; reading,
paging, counting and deleting are in ``dlq_store``, release in ``release``.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from . import checkpoint, outcome, scripts
from .envelope import Envelope, canonical
from .errors import RelierError
from .fencing import Transition, history_tail, parse_transition
from .keys import KeySpace
from .signing import Signer

SUMMARY_CHARS = 200


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


def _entry(
    task_id: str,
    entry_id: str,
    failure: Failure,
    env: Envelope | None,
    raw: object,
    signer: Signer | None,
) -> str:
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
            # Signed: a release verifies it before re-signing, so an entry edited in
            # Redis cannot be laundered into a validly signed message.
            envelope=json.loads(env.encode(signer)),
        )
    else:
        body["raw"] = raw if isinstance(raw, str) else repr(raw)
    return canonical(body)


def _message_entry_id(raw: object) -> str:
    # The same body gets the same entry: a message delivered twice is filed once.
    text = raw if isinstance(raw, str) else repr(raw)
    return "msg-" + hashlib.sha256(text.encode()).hexdigest()[:32]


def _summary(failure: Failure) -> str:
    # One line for listings; the entry keeps the whole message and traceback.
    text = " ".join((failure.error or "").split())
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"


@dataclass(frozen=True, slots=True)
class StoredTask:
    """A stored task as its hash describes it, for when its envelope cannot be read."""

    task_id: str
    fence: int
    task: str
    queue: str
    idem_key: str | None  # the full idempotency key, as push.lua stored it


def dead_letter(
    keys: KeySpace,
    failure: Failure,
    result_ttl_ms: int,
    *,
    env: Envelope | None,
    raw: object = None,
    queue: str = "",
    task: str = "",
    signer: Signer | None = None,
    stored: StoredTask | None = None,
    held: str = "running",
) -> scripts.ScriptCall[Transition]:
    """dead_letter.lua. With ``env`` the move is fenced to that incarnation and the
    task's working keys go with it; without, only the entry is written: a message
    that cannot be tied to a stored task keeps its raw body, with the ``queue`` it
    arrived on and the ``task`` it was addressed to, when known. Pass the config's
    ``signer`` when signing is on, or the entry cannot be released.

    ``stored``: a stored task whose own envelope cannot be read (a copy edited in
    Redis, a key removed too early), described by its task hash: the move is fenced
    to it, its working keys and idempotency claim go, as with ``env``, and the entry
    keeps the ``raw`` text.

    ``held``: the state the caller holds the task in (``running``, ``queued`` for a
    message refused before it started, ``dying`` for the scanner's lease); a task in
    any other state is left alone, so a second copy of a message cannot take a task
    from the copy that runs it. A message tied to no task is filed under an id
    derived from its body: a second copy of it finds its entry and adds nothing.
    """
    idem: str | None = None
    if env is not None:
        entry_id = task_id = env.id
        fence = str(env.fence)
        idem = keys.idempotency(env.task, env.idem_key) if env.idem_key else None
    elif stored is not None:
        entry_id = task_id = stored.task_id
        fence = str(stored.fence)
        task, queue, idem = stored.task, stored.queue, stored.idem_key
    else:
        entry_id = task_id = _message_entry_id(raw)
        fence = ""
        held = ""
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
            fence,
            entry_id,
            _entry(task_id, entry_id, failure, env, raw, signer),
            outcome.failed(str(failure.reason), failure.error, entry_id),
            result_ttl_ms,
            tail,
            env.task if env is not None else task,
            str(failure.reason),
            env.queue if env is not None else queue,
            _summary(failure),
            held,
            uuid.uuid4().hex,
        ],
        parse_transition,
    )


def iso(ms: int) -> str:
    """A Redis-clock time in ms as ISO 8601 UTC with milliseconds, as --json prints it."""
    at = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


@dataclass(frozen=True, slots=True)
class Summary:
    """What a listing shows of an entry; read without the envelope or traceback."""

    id: str
    task_id: str
    task: str  # '' when the message could not be tied to a task
    reason: str
    queue: str
    error: str  # one line, at most SUMMARY_CHARS
    fence: int | None  # the failing incarnation's; None for an untied message
    failed_at_ms: int  # the latest failure (Redis clock)
    first_failed_at_ms: int  # the first time this task landed in the DLQ
    failures: int  # how many times it landed here (releases keep the count)

    @classmethod
    def from_fields(cls, entry_id: str, f: dict[str, str]) -> Summary:
        return cls(
            id=entry_id,
            task_id=f.get("task_id", entry_id),
            task=f.get("task", ""),
            reason=f.get("reason", ""),
            queue=f.get("queue", ""),
            error=f.get("error", ""),
            fence=int(f["fence"]) if f.get("fence") else None,
            failed_at_ms=int(f["at_ms"]),
            first_failed_at_ms=int(f.get("first_ms") or f["at_ms"]),
            failures=int(f.get("failures") or 1),
        )

    def to_json(self) -> dict[str, Any]:
        """The stable ``--json`` form of a summary (docs/dlq-command.md)."""
        return {
            "id": self.id,
            "task_id": self.task_id,
            "task": self.task,
            "reason": self.reason,
            "queue": self.queue,
            "error": self.error,
            "fence": self.fence,
            "failed_at": iso(self.failed_at_ms),
            "first_failed_at": iso(self.first_failed_at_ms),
            "failures": self.failures,
        }


SUMMARY_FIELDS = ("task_id", "task", "reason", "queue", "error", "fence", "at_ms", "first_ms",
                  "failures")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Entry:
    """A whole DLQ entry: the summary, plus what was known at the failure (``data``:
    exception type, message and traceback, worker, the envelope or the raw body) and
    the task's incarnation history (time, event, fence, worker, outcome)."""

    summary: Summary
    data: dict[str, Any]
    history: tuple[dict[str, Any], ...]
    checkpoint_record: str = ""  # the task's last ctx.set_partial, as stored

    @classmethod
    def from_fields(cls, entry_id: str, f: dict[str, str]) -> Entry:
        return cls(
            Summary.from_fields(entry_id, f),
            json.loads(f["entry"]),
            tuple(json.loads(f.get("history") or "[]")),
            f.get("partial", ""),
        )

    @property
    def checkpoint(self) -> Any:
        """The task's last checkpoint (what a release resumes from), or None."""
        try:
            return checkpoint.load(self.checkpoint_record)
        except RelierError as exc:  # a file checkpoint gone missing: say so, keep going
            return {"unreadable": str(exc)}

    @property
    def id(self) -> str:
        return self.summary.id

    @property
    def reason(self) -> str:
        return self.summary.reason

    @property
    def fence(self) -> int | None:
        """The failing incarnation's fence: tells this failure from a later one of the
        same task (None for a message that could not be tied to a task)."""
        return self.summary.fence

    @property
    def envelope(self) -> dict[str, Any] | None:
        return self.data.get("envelope")

    @property
    def raw(self) -> str | None:
        """The message as it arrived, for one that is not a valid envelope."""
        return self.data.get("raw")

    def to_json(self) -> dict[str, Any]:
        """The stable ``--json`` form of an entry (docs/dlq-command.md)."""
        return {
            **self.summary.to_json(),
            "exc_type": self.data.get("exc_type"),
            "exc_message": self.data.get("exc_message"),
            "traceback": self.data.get("traceback"),
            "worker": self.data.get("worker"),
            "attempt": self.data.get("attempt"),
            "envelope": self.envelope,
            "raw": self.raw,
            "checkpoint": self.checkpoint,
            "history": list(self.history),
        }
