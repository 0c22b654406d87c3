"""The exploration: run a task once and record the boundaries its incarnation
crosses; then, for each boundary, run it again with a kill armed there, let relier
recover it, and measure what happened: commits, and the effects the test named.

Each run pushes a new task and measures each effect as a difference (its reading after
the run minus its reading before), so runs need no reset between them.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core import crashpoint
from . import hook
from .report import NO_KILL, Report, Run

EffectSpec = Callable[[], int] | tuple[Callable[[], int], int]
"""A reading of an effect (how many times it happened so far), alone (expected once
per run) or with the count expected per run: ``(fake_gateway.count, 1)``."""


@dataclass(frozen=True, slots=True)
class Effect:
    """An effect a test names: ``read()`` counts its occurrences so far; each run must
    add exactly ``expected``."""

    name: str
    read: Callable[[], int]
    expected: int = 1


def effects_of(effects: Mapping[str, EffectSpec] | None) -> list[Effect]:
    """The effects a test names, with their expected counts."""
    found = []
    for name, spec in (effects or {}).items():
        read, expected = spec if isinstance(spec, tuple) else (spec, 1)
        if not callable(read):
            raise TypeError(f"effect {name!r}: expected a callable returning a count, got {read!r}")
        found.append(Effect(name, read, expected))
    return found


def _label(crossing: hook.Crossing) -> str:
    if crossing.boundary == crashpoint.PUSH:
        return f"push of {crossing.detail}"
    return f"{crossing.boundary} {crossing.detail!r}" if crossing.detail else crossing.boundary


def labels(crossings: Sequence[hook.Crossing], task: str) -> list[str]:
    """The labels of ``task``'s boundaries, up to its commit: a boundary crossed more
    than once is numbered (``checkpoint #2``)."""
    mine = [c for c in crossings if c.of(task)]
    ends = [i for i, c in enumerate(mine) if c.boundary == crashpoint.AFTER_COMMIT]
    if ends:
        mine = mine[: ends[0] + 1]
    names = [_label(c) for c in mine]
    total = collections.Counter(names)
    seen: collections.Counter[str] = collections.Counter()
    numbered = []
    for name in names:
        seen[name] += 1
        numbered.append(f"{name} #{seen[name]}" if total[name] > 1 else name)
    return numbered


# How long a run waits, after its result is readable, for the worker to record crossing
# the commit: the receipt sees commit.lua's write before the worker hears its reply.
SETTLE_S = 10.0


class Explorer:
    """Runs one task through every crash point, against a crash-testing worker whose
    directory is ``directory``."""

    def __init__(self, directory: Path, timeout_s: float) -> None:
        self.directory = directory
        self.timeout_s = timeout_s

    def explore(
        self, task: Any, args: Sequence[Any], kwargs: Mapping[str, Any], effects: list[Effect]
    ) -> Report:
        expected = {e.name: e.expected for e in effects}
        first = self._run(task, args, kwargs, effects, None, NO_KILL)
        runs = [first]
        if not first.problems(expected):  # a task that fails unkilled has nothing to test
            for index, label in enumerate(labels(hook.read_trace(self.directory), task.name)):
                runs.append(self._run(task, args, kwargs, effects, index, label))
        return Report(task.name, expected, tuple(runs))

    def _run(
        self, task: Any, args: Sequence[Any], kwargs: Mapping[str, Any],
        effects: list[Effect], kill_at: int | None, label: str,
    ) -> Run:  # fmt: skip
        (self.directory / hook.TRACE).write_text("")
        if kill_at is not None:
            hook.arm(self.directory, task.name, kill_at)
        before = {e.name: e.read() for e in effects}
        error = ""
        try:
            # At once, even inside the test's transaction: the worker cannot see it.
            task.push_with(on_commit=False).push(*args, **kwargs).get(timeout=self.timeout_s)
        except Exception as exc:  # a TaskFailed, a timeout: reported, not raised
            error = f"{type(exc).__name__}: {exc}"
        commits = self._commits(task.name, wait_s=0 if error else SETTLE_S)
        not_reached = kill_at is not None and hook.disarm(self.directory)
        done = {e.name: e.read() - before[e.name] for e in effects}
        return Run(label, kill_at is not None and not not_reached, commits, done, error)

    def _commits(self, task: str, wait_s: float) -> int:
        """The commits of ``task`` the trace records, once it records one (or after
        ``wait_s``)."""
        deadline = time.monotonic() + wait_s
        while True:
            commits = sum(
                1
                for c in hook.read_trace(self.directory)
                if c.task == task and c.boundary == crashpoint.AFTER_COMMIT
            )
            if commits or time.monotonic() >= deadline:
                return commits
            time.sleep(0.02)
