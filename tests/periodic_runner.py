"""A stand-in scanner for the periodic tests, run as its own process:
``python -m tests.periodic_runner MODE`` with the testproject's environment.

Modes:
    loop            call ``fire_due`` every 0.1 s (Redis clock) until killed.
    die-after-claim one ``fire_due``, SIGKILLed by its own push: claimed, nothing pushed.
    die-after-push  one ``fire_due``, SIGKILLed when it records the tick: pushed, not recorded.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

import django

django.setup()

from relier_django.core.model import config  # noqa: E402
from relier_django.core.schedule import periodic  # noqa: E402
from relier_django.core.store.connection import sync_client  # noqa: E402
from testproject.celery import app  # noqa: E402
from testproject.demo import tasks  # noqa: E402, F401 - registers the demo tasks


def _die(*args: Any, **kwargs: Any) -> Any:
    os.kill(os.getpid(), signal.SIGKILL)


def _now_ms() -> int:
    seconds, micros = sync_client(config.current()).time()
    return int(seconds) * 1000 + int(micros) // 1000


mode = sys.argv[1]
if mode == "die-after-claim":
    periodic.producer = type("Dying", (), {"push": staticmethod(_die)})  # type: ignore[assignment]
elif mode == "die-after-push":
    periodic.done = _die  # type: ignore[assignment]
while True:
    periodic.fire_due(app, config.current(), _now_ms())
    if mode != "loop":
        raise SystemExit("fire_due returned: the fault never fired")
    time.sleep(0.1)
