"""How many messages wait in a broker queue, asked of the broker itself."""

from __future__ import annotations

from typing import Any


def queue_depth(app: Any, queue: str) -> int:
    """Messages ready in ``queue`` (0 when it does not exist yet, or the broker cannot
    say). A passive declare: it never creates the queue."""
    try:
        with app.connection_for_write() as conn:
            declared = conn.default_channel.queue_declare(queue=queue, passive=True)
            return int(declared.message_count)
    except Exception:  # the broker says "no such queue" in its own way
        return 0
