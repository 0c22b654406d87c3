"""The flow-control benchmark's counting (bench/flow_control.py), on made-up records: how
many of a key ran at once (a run a kill cut short counts until the kill), the kill ->
next start of a killed task, the hand-over pairing, the rate, and the verdicts."""

from __future__ import annotations

import pytest

from bench.flow_control import (
    Kill,
    Record,
    ended_twice,
    handovers,
    most_at_once,
    parse,
    rate_figures,
    slot_restarts,
    spans,
    verdicts,
)

pytestmark = pytest.mark.unit


def _r(kind: str, key: str, label: str, ms: int, fence: int = 1, pid: int = 10) -> Record:
    return Record(kind, key, label, fence, ms, pid)


def test_records_are_read_as_the_limit_tasks_write_them():
    assert parse(["start:k1:t3:2:1000:77", "end::r0:1:1010:78"]) == [
        Record("start", "k1", "t3", 2, 1000, 77),
        Record("end", "", "r0", 1, 1010, 78),
    ]


def test_a_run_cut_short_counts_until_its_kill_and_an_unexplained_one_forever():
    records = [
        _r("start", "a", "a0", 0, pid=1),  # killed at 50, resurrected at 60
        _r("start", "a", "a1", 10, pid=2),
        _r("end", "a", "a1", 20, pid=2),
        _r("start", "a", "a0", 60, fence=2, pid=3),
        _r("start", "a", "a2", 40, pid=2),
        _r("end", "a", "a2", 65, pid=2),
        _r("end", "a", "a0", 70, fence=2, pid=3),
    ]
    kills = [Kill(50, frozenset({1}))]
    assert most_at_once(spans(records, kills)) == {"a": 2}
    # Without the kill, a0's first run never ended: it overlaps a0's second run too.
    assert most_at_once(spans(records, [])) == {"a": 3}


def test_an_end_at_the_instant_of_a_start_frees_its_slot_first():
    runs = [("a", 0.0, 10.0), ("a", 0.0, 10.0), ("a", 10.0, 20.0)]
    assert most_at_once(runs) == {"a": 2}


def test_kill_to_the_killed_task_s_next_start_and_a_run_never_started_again():
    records = [
        _r("start", "a", "a0", 1000, pid=1),
        _r("start", "a", "a0", 2500, fence=2, pid=5),
        _r("end", "a", "a0", 2600, fence=2, pid=5),
        _r("start", "b", "b0", 1100, pid=1),  # cut short, never again
        _r("start", "c", "c0", 1200, pid=2),  # another process: not the kill's
        _r("end", "c", "c0", 1300, pid=2),
        _r("start", "d", "d0", 3000, pid=1),  # started after the kill
    ]
    waits, never = slot_restarts(records, [Kill(2000, frozenset({1}))])
    assert waits == [pytest.approx(0.5)]
    assert never == 1


def test_a_task_that_ended_twice_is_explained_by_a_kill_between_its_end_and_commit():
    records = [
        _r("start", "a", "a0", 0, pid=1),
        _r("end", "a", "a0", 10, pid=1),  # killed at 12, before its commit
        _r("start", "a", "a0", 900, fence=2, pid=2),
        _r("end", "a", "a0", 910, fence=2, pid=2),
        _r("start", "b", "b0", 0, pid=3),
        _r("end", "b", "b0", 10, pid=3),  # nothing killed pid 3: unexplained
        _r("start", "b", "b0", 20, fence=2, pid=3),
        _r("end", "b", "b0", 30, fence=2, pid=3),
    ]
    assert ended_twice(records, [Kill(12, frozenset({1}))]) == (2, 1)


def test_the_k_th_end_hands_its_slot_to_the_k_plus_capacity_th_start():
    records = [_r("start", "h", "h0", 0), _r("start", "h", "h1", 1)]
    records += [_r("end", "h", "h0", 100), _r("start", "h", "h2", 130)]
    records += [_r("end", "h", "h1", 110), _r("start", "h", "h3", 150)]
    records += [_r("end", "h", f"h{i}", 200 + i) for i in (2, 3)]
    assert handovers(records, capacity=2) == [30.0, 40.0]
    # A key with a resurrected run is left out: its slot moved, nothing was handed over.
    records.append(_r("start", "h", "h3", 300, fence=2))
    assert handovers(records, capacity=2) == []


def test_the_rate_is_counted_past_the_burst():
    burst = [0] * 20
    steady = [50 * i for i in range(1, 1201)]  # 20 a second for a minute
    found = rate_figures(burst + steady, burst=20, per_s=20.0)
    assert found["per_s"] == pytest.approx(20.0)
    assert found["error"] == pytest.approx(0.0)
    assert found["windows_per_s"] == [20.0] * 5
    assert rate_figures([0, 1], burst=20, per_s=20.0)["per_s"] is None


def test_each_figure_is_judged_against_its_target():
    spread = {"n": 1, "p50": 1.0, "p99": 1.5, "max": 1.5}
    result = {
        "kills": {"max_per_key": 3, "slot_restart_s": spread, "slot_restart_never": 0},
        "handover": {"handover_ms": {"n": 1, "p50": 20.0, "p99": 40.0, "max": 40.0}},
        "rate": {"rate": "20/s", "per_s": 21.5, "error": 0.075},
        "throughput": {"now_over_before": 0.98},
    }
    met = {v["figure"].split(" ")[0]: v["met"] for v in verdicts(result)}
    assert met == {"most": False, "kill": True, "parked": True, "rate": False, "no-op": True}
