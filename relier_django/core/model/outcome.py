"""The outcome record stored under a task's result key, written by commit or
dead-letter, read by receipts. Internal outcomes (stale, duplicate) never get one."""

from __future__ import annotations

import json
from typing import Any

from .envelope import canonical
from .errors import TaskCancelled, TaskFailed, TaskSuperseded


def succeeded(result: Any, fence: int, push: str = "") -> str:
    # The fence names the incarnation that committed: commit.lua recognises a replay
    # of its own call by it (the task hash it checked is gone by then). The push's
    # token (Envelope.push) lets push.lua recognise a client retry of the very push
    # whose task ran and committed before the retry came, once the hash is gone.
    record: dict[str, Any] = {"status": "ok", "result": result, "fence": fence}
    if push:
        record["push"] = push
    return canonical(record)


def too_large(record: str, limit: int) -> str | None:
    """Why a success record cannot be stored: its size against ``limit``
    (``RESULT_MAX_BYTES``), in words that name the fix; None when it fits. A UTF-8
    character takes at most 4 bytes, so a record well within the limit is not even
    encoded to count them."""
    if len(record) * 4 <= limit:
        return None
    size = len(record.encode())
    if size <= limit:
        return None
    return (
        f"the task's result takes {size} bytes encoded, above RESULT_MAX_BYTES ({limit}), "
        "so it was not stored (the body ran once and is not run again). Store the data "
        "elsewhere (a model row, a file, object storage) and return its id, or raise "
        "settings.RELIER['RESULT_MAX_BYTES']"
    )


def result_json(record: str) -> str:
    """The result inside a success record, as canonical JSON (a chord member's
    result, as its commit records it in the chord's state)."""
    return canonical(json.loads(record)["result"])


def failed(reason: str, error: str | None, entry_id: str) -> str:
    return canonical({"status": "failed", "reason": reason, "error": error, "dlq_id": entry_id})


def cancelled(token: str, running: bool) -> str:
    # The token tells cancel.lua its own record from another call's (a replay).
    return canonical({"status": "cancelled", "by": token, "running": running})


SUPERSEDED = "superseded"
"""The status of a debounced task superseded by a later push of its key. push.lua
writes the record itself: ``{"by": <the later task's id>, "of": <sha1 of the
superseded envelope>, "status": "superseded"}`` (canonical: keys sorted)."""


def read(task_id: str, record: str) -> Any:
    """The task's result; ``TaskFailed`` when it was dead-lettered, ``TaskCancelled``
    when it was cancelled, ``TaskSuperseded`` (a ``TaskCancelled``) when a later
    debounced push superseded it."""
    data = json.loads(record)
    if data["status"] == "ok":
        return data["result"]
    if data["status"] == SUPERSEDED:
        raise TaskSuperseded(task_id, str(data["by"]))
    if data["status"] == "cancelled":
        raise TaskCancelled(task_id)
    raise TaskFailed(task_id, data["reason"], data.get("error"))
