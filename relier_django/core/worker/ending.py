"""How one delivered message ended, as the runner reports it to its caller.

The runner stays free of Celery: it says what happened (committed, retried,
dead-lettered, or not this copy's to run), and the composition root (``task._entry``)
turns that into the Celery ending that matches (SUCCESS, RETRY, FAILURE, IGNORED), so
Celery's signals, events, Flower and error trackers tell the truth about the task.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Ending(StrEnum):
    COMMITTED = "committed"  # commit.lua stored the result
    RETRIED = "retried"  # retry.lua stored the next incarnation (and it was sent, or is covered)
    DEAD = "dead"  # dead_letter.lua filed it
    # handoff.lua gave it up as a death (a MemoryError: cause 'oom'); the scanner
    # resurrects or dead-letters it by max_resurrections for that cause.
    HANDED_OFF = "handed_off"
    # Not this copy's to run or finish: start.lua refused it (a stale or duplicate
    # copy), it was superseded while running, or its commit, retry or dead-letter was
    # refused because another incarnation holds the task. Nothing was decided here.
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class Ended:
    """What became of one delivered message.

    Attributes:
        how: the ending.
        task_id: the task's id; None for a message that names none (malformed).
        result: the task's return value (``COMMITTED``).
        error: the task's own exception behind a retry or a dead-letter, when the
            failure is that exception (not a schema refusal, a hard timeout's
            cancellation, or a result that is not JSON).
        reason: the DLQ reason code (``DEAD``).
        detail: one line: the failure (``DEAD``), the error retried (``RETRIED``), or
            why this copy was refused (``REFUSED``).
        delay_s: seconds until the next incarnation is due (``RETRIED``).
    """

    how: Ending
    task_id: str | None = None
    result: Any = None
    error: Exception | None = None
    reason: str | None = None
    detail: str | None = None
    delay_s: float | None = None
