"""The header that marks a message as relier_django's.

Written by ``publish`` on every message it builds, read by ``transport`` to decide
where a delivery is tracked: a message of relier's needs none of kombu's ack
emulation, since relier's store covers it.
"""

from __future__ import annotations

from typing import Any

#: The value is the incarnation's fence, for monitoring.
MARKER_HEADER = "relier_fence"


def is_relier_message(message: Any) -> bool:
    """Whether ``message`` was published by relier_django (the envelope itself is
    verified later, by the task; this only decides where its delivery is tracked)."""
    headers = getattr(message, "headers", None)
    return isinstance(headers, dict) and MARKER_HEADER in headers
