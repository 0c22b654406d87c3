"""A scenario's report: settings, the faults injected, invariants, timings; as text and JSON."""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import Any

from .evidence import Execution
from .invariants import Check


@dataclass(frozen=True)
class Fault:
    at: float  # time.time()
    text: str
    interrupts: bool = True  # counts for recovery latencies (a heal or a SIGCONT does not)
    # The processes it took or froze; empty: every process (Redis, the network).
    pids: tuple[int, ...] = ()


@dataclass
class Report:
    scenario: str
    summary: str
    seed: int
    tasks: int
    workers: int
    settings: dict[str, str] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    timings: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    run_dir: str = ""
    started_at: float = 0.0
    error: str | None = None  # the run itself broke (not an invariant)

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.checks) and all(c.ok for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["ok"] = self.ok
        return data

    def render(self) -> str:
        lines = [f"== {self.scenario}: {self.summary}"]
        settings = ", ".join(f"{k} {v}" for k, v in self.settings.items())
        lines.append(
            f"   seed {self.seed}, {self.tasks} tasks, {self.workers} worker(s)"
            + (f"; {settings}" if settings else "")
        )
        if self.faults:
            lines.append("faults injected:")
            for fault in self.faults:
                lines.append(f"  {fault.at - self.started_at:+8.2f} s  {fault.text}")
        if self.checks:
            lines.append("invariants:")
            width = max(len(c.name) for c in self.checks)
            for c in self.checks:
                lines.append(f"  {'PASS' if c.ok else 'FAIL'}  {c.name:<{width}}  {c.detail}")
        if self.timings:
            lines.append("timings:")
            width = max(len(k) for k in self.timings)
            for k, v in self.timings.items():
                lines.append(f"  {k:<{width}}  {v}")
        for note in self.notes:
            lines.append(f"note: {note}")
        if self.error:
            lines.append(f"ERROR: {self.error}")
        verdict = "PASS" if self.ok else "FAIL"
        where = f" (logs kept in {self.run_dir})" if self.run_dir and not self.ok else ""
        lines.append(f"RESULT {self.scenario}: {verdict}{where}")
        return "\n".join(lines)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def recovery_latencies(executions: list[Execution], faults: list[Fault]) -> list[float]:
    """For each restart of a task: from the first interrupting fault that hit the
    process of its previous start, after that start, to the task running again.

    The first such fault, not the last before the restart: a later fault (another
    worker killed while this task waited for its resurrection) would make the recovery
    look shorter than it was."""
    hits = sorted((f.at, f.pids) for f in faults if f.interrupts)
    starts: dict[str, list[tuple[float, int]]] = {}
    for e in executions:
        if e.event == "start":
            starts.setdefault(e.task_id, []).append((e.at, e.pid))
    out = []
    for task_starts in starts.values():
        for (previous, pid), (restart, _) in itertools.pairwise(sorted(task_starts)):
            took = [
                at for at, pids in hits if previous <= at <= restart and (not pids or pid in pids)
            ]
            if took:
                out.append(restart - took[0])
    return out


def latency_summary(values: list[float]) -> str:
    if not values:
        return "none measured (no task was interrupted by a fault)"
    return (
        f"n={len(values)}  p50 {percentile(values, 50):.2f} s  p99 {percentile(values, 99):.2f} s"
        f"  max {max(values):.2f} s"
    )
