"""The chaos report's recovery latency: from the fault that took the run's process."""

from __future__ import annotations

from chaos.evidence import Execution
from chaos.report import Fault, recovery_latencies


def _start(task_id: str, pid: int, at: float) -> Execution:
    return Execution("start", task_id, 1, pid, "w", at)


def test_a_recovery_counts_from_the_fault_that_took_its_process_not_a_later_one():
    runs = [_start("a", 11, 0.0), _start("a", 22, 12.0)]
    faults = [
        Fault(1.0, "SIGKILL pool process 11", pids=(11,)),
        Fault(9.0, "SIGKILL pool process 33, another worker's", pids=(33,)),
        Fault(10.0, "SIGKILL worker holding 11", pids=(10, 11)),  # 11 was already dead
    ]
    assert recovery_latencies(runs, faults) == [11.0]


def test_a_fault_without_pids_hits_every_process_and_heals_do_not_count():
    runs = [_start("a", 11, 0.0), _start("a", 22, 5.0), _start("b", 11, 0.0)]
    faults = [Fault(2.0, "kill -9 redis-server"), Fault(3.0, "healed", interrupts=False)]
    assert recovery_latencies(runs, faults) == [3.0]


def test_a_restart_no_fault_hit_is_no_recovery():
    runs = [_start("a", 11, 0.0), _start("a", 22, 5.0)]
    assert recovery_latencies(runs, [Fault(2.0, "SIGKILL 33", pids=(33,))]) == []
