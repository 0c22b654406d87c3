"""Worker lifecycle hooks.

``task_unknown``: a worker that receives an envelope for a task it does not know
(a rolling deploy, a typo in a route) dead-letters it with reason ``unknown_task``
instead of letting Celery discard it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import signals

from . import bridge, config
from .runner import Runner

logger = logging.getLogger("relier_django.signals")


def _on_task_unknown(sender: Any = None, message: Any = None, name: str = "", **_: Any) -> None:
    try:
        body = message.decode() if message is not None else None
    except Exception:  # an undecodable body is not ours to judge; Celery already logged it
        return
    args = body[0] if isinstance(body, list | tuple) and body else None
    if not (isinstance(args, list | tuple) and len(args) == 1 and isinstance(args[0], str)):
        return  # not an @rl_task message
    if '"sha256"' not in args[0]:
        return
    hostname = getattr(sender, "hostname", None) or os.uname().nodename
    runner = Runner(
        None, getattr(sender, "app", None), config.current(), f"{hostname}:{os.getpid()}"
    )
    try:
        bridge.run(runner.run(args[0], expected_task=name), timeout_s=30)
    except Exception:
        logger.error(
            "could not dead-letter unknown task %s; message body: %r", name, args[0], exc_info=True
        )


def connect() -> None:
    """Connect the hooks (idempotent)."""
    signals.task_unknown.connect(
        _on_task_unknown, dispatch_uid="relier_django.task_unknown", weak=False
    )
