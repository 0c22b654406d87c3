"""The pop-trace benchmark's verdict (bench/pop_trace.py), on made-up waits: a task
that never started, or started more than 10 s after its push, waited."""

from __future__ import annotations

import pytest

from bench.pop_trace import LATE_S, _verdict

pytestmark = pytest.mark.unit


def test_a_task_never_started_or_started_late_counts_as_waited_and_the_rest_do_not():
    waits = [0.01, 0.4, LATE_S + 0.1, None, 1.2]
    found = _verdict(waits, kills=2)
    assert found["waited_over_10s"] == 2
    assert found["never_started"] == 1
    assert found["per_kill"] == 1.0
    assert found["wait_p50_s"] == pytest.approx(0.8)  # of the four that started
    assert found["wait_max_s"] == pytest.approx(LATE_S + 0.1)


def test_no_kill_and_no_start_leave_no_division_by_zero():
    assert _verdict([None], kills=0) == {
        "tasks": 1, "kills": 0, "waited_over_10s": 1, "never_started": 1,
        "per_kill": 0.0, "wait_p50_s": None, "wait_max_s": None,
    }  # fmt: skip
