"""How a pool process died, named from billiard's report and the cgroup's OOM count."""

from __future__ import annotations

from pathlib import Path

from billiard.common import human_status
from billiard.exceptions import WorkerLostError

from relier_django.core.worker import exits


def lost(status: int) -> WorkerLostError:
    # billiard's own wording (Pool.mark_as_worker_lost), built with its own helper.
    return WorkerLostError(f"Worker exited prematurely: {human_status(status)} Job: 3.")


def test_a_signal_or_an_exit_code_is_named_from_the_exit_status() -> None:
    assert exits.exit_cause(lost(-9)) == "signal:SIGKILL"
    assert exits.exit_cause(lost(-11)) == "signal:SIGSEGV"
    assert exits.exit_cause(lost(3)) == "exit:3"
    assert exits.exit_cause(WorkerLostError("no status")) == ""
    assert exits.exit_cause(None) == ""


def test_a_sigkill_is_oom_only_while_the_cgroups_oom_count_went_up() -> None:
    counts = iter([4, 4, 5, 5, 7, 7])
    deaths = exits.Deaths(lambda: next(counts))  # 4 at start
    assert deaths.cause(lost(-9)) == "signal:SIGKILL"  # 4: none since
    assert deaths.cause(lost(-9)) == "oom"  # 5
    assert deaths.cause(lost(-9)) == "signal:SIGKILL"  # 5: that one was counted
    assert deaths.cause(lost(-9)) == "oom"  # 7: two kills, one per SIGKILL
    assert deaths.cause(lost(-9)) == "oom"
    assert deaths.cause(lost(3)) == "exit:3"  # the count is not read for an exit


def test_without_a_readable_count_a_sigkill_stays_a_sigkill() -> None:
    deaths = exits.Deaths(lambda: None)
    assert deaths.cause(lost(-9)) == "signal:SIGKILL"


def test_the_oom_count_is_read_from_the_processs_own_memory_cgroup(tmp_path: Path) -> None:
    membership = tmp_path / "cgroup"
    membership.write_text("0::/pod/worker\n")
    v2 = tmp_path / "pod" / "worker"
    v2.mkdir(parents=True)
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 2\noom 2\noom_kill 2\n")
    assert exits.oom_kills(tmp_path, membership) == 2

    membership.write_text("4:memory:/box\n1:cpu:/\n0::/\n")  # cgroup v1's memory
    v1 = tmp_path / "memory" / "box"
    v1.mkdir(parents=True)
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    assert exits.oom_kills(tmp_path, membership) == 5
    assert exits.oom_kills(tmp_path / "none", membership) is None


def test_the_admin_history_table_shows_the_cause() -> None:
    from relier_django.readers.render import history_table

    event = {"at_ms": 1, "event": "expired", "fence": 1, "cause": "signal:SIGKILL"}
    row = history_table([event])[0]
    assert row["cause"] == "signal:SIGKILL"  # a column of its own, not among the details
    assert "cause" not in row["details"]
