"""The crash-testing worker's side: each boundary one of its processes crosses is
appended to a trace file, and at the armed one the process kills itself (SIGKILL), as
an OOM kill or a lost host would end it: no ``finally``, no atexit, no goodbye to
Redis or the database.

The worker and the test share one directory. ``trace``: one line per crossing, in
order (pid, task, boundary, detail, tab-separated). ``arm``: the task name and the
index of the crossing to die at, among that task's own crossings in the trace; the
process that dies removes it first, so one arming kills once, and the incarnation that
recovers the task runs to its end.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

TRACE = "trace"
ARM = "arm"


@dataclass(frozen=True, slots=True)
class Crossing:
    """One boundary crossed by one process."""

    pid: int
    task: str  # the incarnation's task name; '' where it was not known
    boundary: str  # a name from relier_django.core.crashpoint
    detail: str  # the pushed task, the inbox unit's name, or ''

    def encode(self) -> str:
        return f"{self.pid}\t{self.task}\t{self.boundary}\t{self.detail}\n"

    @classmethod
    def decode(cls, line: str) -> Crossing:
        pid, task, boundary, detail = line.rstrip("\n").split("\t", 3)
        return cls(int(pid), task, boundary, detail)

    def of(self, task: str) -> bool:
        """Crossed by an incarnation of ``task`` (or by code that did not say whose)."""
        return self.task in (task, "")


def read_trace(directory: Path) -> list[Crossing]:
    """Every crossing recorded in ``directory``, in order."""
    try:
        text = (directory / TRACE).read_text()
    except FileNotFoundError:
        return []
    return [Crossing.decode(line) for line in text.splitlines(keepends=True) if line.strip()]


def arm(directory: Path, task: str, index: int) -> None:
    """Make the process that crosses ``task``'s boundary number ``index`` (from 0) die."""
    staged = directory / f"{ARM}.new"
    staged.write_text(f"{task}\n{index}\n")
    staged.replace(directory / ARM)  # whole or absent, never half-written


def disarm(directory: Path) -> bool:
    """Remove the arming; True if it was still there (its boundary was not reached)."""
    try:
        (directory / ARM).unlink()
    except FileNotFoundError:
        return False
    return True


def _armed(directory: Path) -> tuple[str, int] | None:
    try:
        task, index = (directory / ARM).read_text().split()
    except (FileNotFoundError, ValueError):
        return None
    return task, int(index)


def _running_task() -> str:
    # A push does not know whose incarnation makes it; Celery's task stack does, in the
    # pool thread that runs a plain def task.
    from celery import current_task

    return str(current_task.name) if current_task else ""


class Recorder:
    """The hook a crash-testing worker installs (``core.crashpoint.install``)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def __call__(self, boundary: str, task: str, detail: str) -> None:
        crossing = Crossing(os.getpid(), task or _running_task(), boundary, detail)
        fd = os.open(self.directory / TRACE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, crossing.encode().encode())  # one write: lines never interleave
        finally:
            os.close(fd)
        armed = _armed(self.directory)
        if armed is None or not crossing.of(armed[0]):
            return
        watched, index = armed
        position = sum(1 for c in read_trace(self.directory) if c.of(watched)) - 1
        if position == index and disarm(self.directory):
            os.kill(os.getpid(), signal.SIGKILL)
