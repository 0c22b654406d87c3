"""Receivers of relier's Django signals for the tests that run real workers: each
signal received is appended, one JSON line, to the file ``DEMO_SIGNAL_LOG`` names
(read at each signal; nothing is written when it is unset), with the pid of the
process that received it."""

from __future__ import annotations

import json
import os
from typing import Any

from django.dispatch import receiver

from relier_django import signals

_NAMES = {
    signals.task_dead_lettered: "task_dead_lettered",
    signals.task_resurrected: "task_resurrected",
    signals.task_released: "task_released",
    signals.task_cancelled: "task_cancelled",
}


@receiver(list(_NAMES), dispatch_uid="demo.observers")
def _log(sender: Any, signal: Any, event: Any, **fields: Any) -> None:
    path = os.environ.get("DEMO_SIGNAL_LOG")
    if not path:
        return
    line = json.dumps({"signal": _NAMES[signal], "pid": os.getpid(), **fields})
    with open(path, "a") as fh:  # one short append per line: whole lines across processes
        fh.write(line + "\n")
