"""Why a task cannot complete: the DLQ's reason codes and what is known of a failure.

Pure values, written by the runner, the scanner and the DLQ, read by receipts and the
admin; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


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
