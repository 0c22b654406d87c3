"""store/clock.py: the Redis clock read with TIME once per interval, the local
monotonic clock in between (issue 37: TIME was a third of an idle leader's commands)."""

from __future__ import annotations

from relier_django.core.store.clock import ServerClock


class _Redis:
    def __init__(self) -> None:
        self.server_ms = 1_700_000_000_000
        self.reads = 0

    def time(self) -> tuple[int, int]:
        self.reads += 1
        return (self.server_ms // 1000, (self.server_ms % 1000) * 1000)


def test_the_server_is_asked_once_per_interval_and_the_time_between_follows_it():
    redis, local = _Redis(), [50.0]
    clock = ServerClock(lambda: redis, recalibrate_s=5.0, monotonic=lambda: local[0])
    assert clock.now_ms() == redis.server_ms and redis.reads == 1
    for _ in range(40):  # 4 s, in steps of 100 ms
        local[0] += 0.1
        redis.server_ms += 100
        assert abs(clock.now_ms() - redis.server_ms) <= 1
    assert redis.reads == 1
    local[0] += 1.0
    redis.server_ms += 1000 + 250  # the server's clock stepped 250 ms meanwhile
    assert clock.now_ms() == redis.server_ms and redis.reads == 2  # seen at the next read


def test_forget_makes_the_next_reading_ask_the_server():
    redis, local = _Redis(), [0.0]
    clock = ServerClock(lambda: redis, monotonic=lambda: local[0])
    clock.now_ms()
    redis.server_ms += 60_000  # a failover to a server whose clock is a minute ahead
    clock.forget()
    assert clock.now_ms() == redis.server_ms and redis.reads == 2
