"""The crash-point plugin's pure parts (docs/crash-testing.md): the worker-side hook
records each crossing and kills its process at the armed one, once; boundaries are
labelled and numbered up to the task's commit; a report names the boundary where an
effect doubled. The whole plugin, with a real worker: tests/chaos/test_crashpoints.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from relier_django.core import crashpoint
from relier_django.crashpoints import Report, Run
from relier_django.crashpoints.explore import effects_of, labels
from relier_django.crashpoints.hook import Crossing, Recorder, arm, disarm, read_trace


def _cross_in_a_child(directory: Path, boundaries: list[str]) -> int:
    """Cross ``boundaries`` as task ``t`` in a process of its own; its return code."""
    code = (
        "import sys; from pathlib import Path; "
        "from relier_django.crashpoints.hook import Recorder; "
        "r = Recorder(Path(sys.argv[1])); [r(b, 't', '') for b in sys.argv[2:]]"
    )
    done = subprocess.run([sys.executable, "-c", code, str(directory), *boundaries], timeout=60)
    return done.returncode


def test_the_armed_crossing_kills_its_process_once_and_the_trace_keeps_what_came_before(
    tmp_path,
):
    arm(tmp_path, "t", 1)
    status = _cross_in_a_child(tmp_path, ["checkpoint", "before commit.lua", "after commit.lua"])
    assert status == -signal.SIGKILL
    assert [c.boundary for c in read_trace(tmp_path)] == ["checkpoint", "before commit.lua"]
    assert not disarm(tmp_path)  # the dying process took the arming with it
    # The incarnation that recovers the task crosses the same boundary and lives.
    assert _cross_in_a_child(tmp_path, ["before commit.lua", "after commit.lua"]) == 0


def test_another_tasks_crossings_do_not_move_the_armed_position(tmp_path):
    arm(tmp_path, "t", 0)
    Recorder(tmp_path)("before commit.lua", "other", "")  # not t's: not counted, no kill
    assert disarm(tmp_path)
    assert read_trace(tmp_path) == [Crossing(os.getpid(), "other", "before commit.lua", "")]


def test_boundaries_are_labelled_in_order_numbered_and_cut_at_the_tasks_commit():
    crossings = [
        Crossing(1, "t", crashpoint.CHECKPOINT, ""),
        Crossing(1, "other", crashpoint.CHECKPOINT, ""),
        Crossing(1, "", crashpoint.PUSH, "shop.mail"),
        Crossing(1, "t", crashpoint.BEFORE_INBOX_COMMIT, "refund"),
        Crossing(1, "t", crashpoint.CHECKPOINT, ""),
        Crossing(1, "t", crashpoint.BEFORE_COMMIT, ""),
        Crossing(1, "t", crashpoint.AFTER_COMMIT, ""),
        Crossing(1, "", crashpoint.PUSH, "shop.later"),  # after the commit: not the task's
    ]
    assert labels(crossings, "t") == [
        "checkpoint #1",
        "push of shop.mail",
        "before inbox commit 'refund'",
        "checkpoint #2",
        "before commit.lua",
        "after commit.lua",
    ]


def test_a_report_names_the_boundary_where_an_effect_doubled_and_raises_with_it():
    runs = (
        Run("no kill", False, 1, {"charges": 1}),
        Run("before commit.lua", True, 1, {"charges": 2}),
        Run("after commit.lua", False, 1, {"charges": 1}),
        Run("checkpoint", True, 0, {"charges": 1}, error="TimeoutError: no result"),
    )
    report = Report("shop.checkout", {"charges": 1}, runs)
    assert report.boundaries == ["before commit.lua", "after commit.lua", "checkpoint"]
    assert report.failures == [
        "effect 'charges' happened 2 times after a kill at 'before commit.lua' (expected 1)",
        "the run never reached 'after commit.lua' (the task's path changed)",
        "the task did not commit after a kill at 'checkpoint': TimeoutError: no result",
    ]
    with pytest.raises(AssertionError, match="3 failed"):
        report.check()
    passing = Report("shop.checkout", {"charges": 1}, runs[:1])
    assert passing.check() is passing


def test_effects_are_expected_once_unless_a_count_is_given():
    found = effects_of({"charges": lambda: 0, "emails": (lambda: 0, 2)})
    assert [(e.name, e.expected) for e in found] == [("charges", 1), ("emails", 2)]
    with pytest.raises(TypeError, match="'rows'"):
        effects_of({"rows": 3})  # type: ignore[dict-item]
