"""The store-cost benchmark's bookkeeping (bench/store_cost.py), on made-up MONITOR
lines and slow-log entries: requests apart from what scripts ran, each EVALSHA named
by its script."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.store_cost import _entries, _requests
from relier_django.core.store.scripts import START

pytestmark = pytest.mark.unit


def test_monitor_lines_count_requests_apart_from_what_scripts_ran(tmp_path: Path) -> None:
    capture = tmp_path / "monitor.txt"
    capture.write_text(
        "OK\n"
        f'1764120000.000001 [0 127.0.0.1:50001] "EVALSHA" "{START.sha}" "5" "rl:t:{{a}}"\n'
        '1764120000.000002 [0 lua] "HMGET" "rl:t:{a}" "fence"\n'
        '1764120000.000003 [0 lua] "ZADD" "rl:expiry" "1" "a"\n'
        '1764120000.000004 [0 127.0.0.1:50002] "BRPOP" "celery" "1"\n'
        '1764120000.000005 [0 127.0.0.1:50002] "rpush" "demo:exec:x" "-"\n'
        '1764120000.000006 [0 127.0.0.1:50003] "EVALSHA" "0123456789abcdef" "0"\n'
    )
    sent, nested = _requests(capture)
    assert sent == {"evalsha start": 1, "BRPOP": 1, "RPUSH": 1, "evalsha 01234567": 1}
    assert nested == {"HMGET": 1, "ZADD": 1}


class _SlowLog:
    def __init__(self, entries: list[dict[str, object]]) -> None:
        self.entries = entries

    def slowlog_get(self, count: int) -> list[dict[str, object]]:
        return self.entries[:count]


def test_slow_log_entries_come_oldest_first_with_each_script_named() -> None:
    newest_first = [
        {"command": b"RPUSH demo:exec:x -", "duration": 3},
        {"command": f"EVALSHA {START.sha} 5 rl:t:{{a}}", "duration": 40},
    ]
    assert _entries(_SlowLog(newest_first)) == [("evalsha start", 40), ("RPUSH", 3)]
