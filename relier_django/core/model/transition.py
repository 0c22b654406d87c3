"""The replies of fence-checked writes, and the task history they append to.

Pure values and their parsing, shared by the worker's transitions, the checkpoint
store, the scanner and the DLQ; no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .envelope import canonical


def history_tail(event: str, **fields: Any) -> str:
    """A history entry without its opening brace; the script prefixes the server time."""
    return canonical({"event": event, **fields})[1:]


@dataclass(frozen=True, slots=True)
class Transition:
    """The reply of a fence-checked write: accepted, or the fence that refused it."""

    accepted: bool
    value: int  # the new fence for retry, the current fence when refused (-1: gone)
    state: str = ""  # when refused by a script that checks it: the state found


def parse_transition(reply: list[Any]) -> Transition:
    return Transition(int(reply[0]) == 1, int(reply[1]), str(reply[2]) if len(reply) > 2 else "")


def decode_history(raw: str) -> list[dict[str, Any]]:
    return list(json.loads(raw)) if raw else []
