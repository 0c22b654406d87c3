"""The Redis server's clock, read without asking it every time.

The scanner decides when to wake (the next due scheduled task, the next periodic tick)
and stamps a holder's last sign of life on the Redis clock, several times a second.
Asking ``TIME`` each time was a third of an idle leader's commands (issue 37). A
``ServerClock`` asks once every ``recalibrate_s`` and adds the local monotonic time
elapsed since: the reading is off by at most half the round trip of the calibration
plus the drift between the two clocks over ``recalibrate_s`` (parts per million), far
under the millisecond the scanner works in. A step of the server's clock (an NTP jump)
is seen at the next calibration.

It is only for decisions that tolerate a few milliseconds: every script that enforces
a deadline (``schedule_take.lua``, ``take.lua``, ``orphans.lua``) still reads ``TIME``
itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

RECALIBRATE_S = 5.0


class ServerClock:
    """Redis time in epoch ms: ``TIME`` once per ``recalibrate_s``, the local monotonic
    clock in between."""

    def __init__(
        self,
        client: Callable[[], Any],
        recalibrate_s: float = RECALIBRATE_S,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        self._client = client
        self._recalibrate_s = recalibrate_s
        # Looked up at each call by default, so a test that fakes time.monotonic fakes
        # this clock too.
        self._monotonic = monotonic or (lambda: time.monotonic())
        self._offset_ms: float | None = None  # server ms minus local monotonic ms
        self._read_at = 0.0

    def now_ms(self) -> int:
        """The server's time, epoch ms."""
        now = self._monotonic()
        if self._offset_ms is None or now - self._read_at >= self._recalibrate_s:
            sent_at = now
            self.calibrate(self._client().time(), sent_at)
            now = self._monotonic()
        assert self._offset_ms is not None
        return int(self._offset_ms + now * 1000)

    def calibrate(self, reply: Any, sent_at: float | None = None) -> int:
        """Take a ``TIME`` reply read just now (``sent_at``: the monotonic time the
        request left, to split the round trip); returns it in epoch ms."""
        seconds, micros = reply
        return self.calibrate_ms(int(seconds) * 1000 + int(micros) // 1000, sent_at)

    def calibrate_ms(self, server_ms: int, sent_at: float | None = None) -> int:
        """As :meth:`calibrate`, from a reading already in epoch ms."""
        now = self._monotonic()
        middle = now if sent_at is None else (sent_at + now) / 2
        self._offset_ms = server_ms - middle * 1000
        self._read_at = now
        return server_ms

    def forget(self) -> None:
        """Ask the server at the next reading (after a restart or a failover, whose new
        server may keep another time)."""
        self._offset_ms = None
