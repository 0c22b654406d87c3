"""The shape of a DLQ entry as it is read back: ``Summary`` (what a listing shows) and
``Entry`` (all of it), with their stable ``--json`` forms."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..model.errors import RelierError
from ..store import checkpoint


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
