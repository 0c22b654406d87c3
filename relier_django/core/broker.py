"""The only code that hands an envelope to Celery."""

from __future__ import annotations

from typing import Any

from .envelope import Envelope


def send(app: Any, env: Envelope, encoded: str | None = None, countdown_s: float = 0.0) -> None:
    """Publish one incarnation. Returns once the broker accepted the message (for the
    Redis transport: once LPUSH returned). Raises whatever the transport raises."""
    app.send_task(
        env.task,
        args=[encoded if encoded is not None else env.encode()],
        task_id=env.id,
        queue=env.queue or None,
        serializer="json",
        countdown=countdown_s or None,
        ignore_result=True,
    )
