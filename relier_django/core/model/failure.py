"""Why a task cannot complete: the DLQ's reason codes and what is known of a failure.

Pure values, written by the runner, the scanner and the DLQ, read by receipts and the
admin; no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .envelope import Envelope, canonical
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
    RESULT_TOO_LARGE = "result_too_large"  # encoded result above RESULT_MAX_BYTES
    EXPIRED = "expired"  # not started by its expires= time
    # A workflow's member (a chain's step with steps after it, a chord's member)
    # cancelled: filed with the rest of its workflow, which waits for its release.
    CANCELLED = "cancelled"


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

    @property
    def summary(self) -> str:
        """One line for listings; the entry keeps the whole message and traceback."""
        text = " ".join((self.error or "").split())
        return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"


def entry_json(
    task_id: str,
    entry_id: str,
    failure: Failure,
    env: Envelope | None,
    raw: object,
    signer: Signer | None,
) -> str:
    """A DLQ entry's ``entry`` field: the failure, and the envelope it can be released
    from (signed: a release verifies it before re-signing, so an entry edited in Redis
    cannot be laundered into a validly signed message) or, for a message tied to no
    task, its raw body."""
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
            envelope=json.loads(env.encode(signer)),
        )
    else:
        body["raw"] = raw if isinstance(raw, str) else repr(raw)
    return canonical(body)
