"""What a crash-point exploration found: one run per boundary, each judged against the
effects the test expects, and a report that names the boundary where an effect
doubled (or went missing)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

NO_KILL = "no kill"


@dataclass(frozen=True, slots=True)
class Run:
    """One run of the task: killed at ``boundary`` (or not at all, ``NO_KILL``).

    Attributes:
        boundary: the boundary's label, as :attr:`Report.boundaries` lists it.
        killed: the incarnation died there (False: the run never reached it).
        commits: how many commits of the task were accepted (``commit.lua``).
        effects: how many times each named effect happened during the run.
        error: why the task did not commit ('' when it did).
    """

    boundary: str
    killed: bool
    commits: int
    effects: Mapping[str, int] = field(default_factory=dict)
    error: str = ""

    def problems(self, expected: Mapping[str, int]) -> list[str]:
        """Every way this run broke a promise; empty when it kept them all."""
        at = "without a kill" if self.boundary == NO_KILL else f"after a kill at {self.boundary!r}"
        found = []
        if self.boundary != NO_KILL and not self.killed:
            found.append(f"the run never reached {self.boundary!r} (the task's path changed)")
        if self.error:
            found.append(f"the task did not commit {at}: {self.error}")
        elif self.commits != 1:
            found.append(f"the task committed {self.commits} times {at}")
        for name, want in expected.items():
            got = self.effects.get(name)
            if got != want:
                found.append(f"effect {name!r} happened {got} times {at} (expected {want})")
        return found


@dataclass(frozen=True, slots=True)
class Report:
    """The runs of one task: the first without a kill, then one per boundary it
    crossed, in order.

    Attributes:
        task: the task's name.
        expected: each effect's expected count per run.
        runs: the runs, the one without a kill first.
    """

    task: str
    expected: Mapping[str, int]
    runs: tuple[Run, ...]

    @property
    def boundaries(self) -> list[str]:
        """The boundaries the task crosses, in order (one kill run each)."""
        return [r.boundary for r in self.runs if r.boundary != NO_KILL]

    @property
    def failures(self) -> list[str]:
        """Every problem of every run, each naming its boundary."""
        return [p for r in self.runs for p in r.problems(self.expected)]

    @property
    def passed(self) -> bool:
        """Every run committed once, with each effect as often as expected."""
        return not self.failures

    def __str__(self) -> str:
        failed = sum(1 for r in self.runs if r.problems(self.expected))
        lines = [
            f"crash points of {self.task}: {len(self.boundaries)} boundaries, "
            f"{len(self.runs)} runs, {failed} failed"
        ]
        for run in self.runs:
            problems = run.problems(self.expected)
            counts = ", ".join(f"{k}={v}" for k, v in run.effects.items())
            shown = f"commits={run.commits}" + (f", {counts}" if counts else "")
            lines.append(f"  {'FAIL' if problems else 'ok  '}  {run.boundary:<40} {shown}")
            lines.extend(f"        {p}" for p in problems)
        return "\n".join(lines)

    def check(self) -> Report:
        """Return the report if every run kept every promise.

        Raises:
            AssertionError: with the whole report, which names each failing boundary.
        """
        if not self.passed:
            raise AssertionError(str(self))
        return self
