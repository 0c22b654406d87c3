"""How a pool process died, as its worker's main process saw it.

Billiard's pool reports a lost pool process with ``WorkerLostError`` whose message
carries the process's exit status (``signal 9 (SIGKILL)``, ``exitcode 3``): the main
process waited on its child, so this is the kernel's word, not a guess. Whether a
SIGKILL came from the kernel's OOM killer is not in the exit status; the worker's
memory cgroup counts its OOM kills (``oom_kill`` in cgroup v2's ``memory.events``, in
v1's ``memory.oom_control``), so a SIGKILL seen while that counter went up is called
``oom``. That is best effort: with neither file readable an OOM kill reads as
``signal:SIGKILL``, and two pool processes killed at once, one by the OOM killer and
one by hand, may swap causes.
"""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import Callable
from pathlib import Path

_STATUS = re.compile(r"\b(signal|exitcode) (-?\d+)")
_CGROUP_ROOT = Path("/sys/fs/cgroup")
_MEMBERSHIP = Path("/proc/self/cgroup")


def exit_cause(exception: BaseException | None) -> str:
    """``signal:<NAME>`` or ``exit:<code>`` from a ``WorkerLostError``'s message, ``""``
    when it carries no status."""
    found = _STATUS.search(str(exception or ""))
    if found is None:
        return ""
    kind, number = found.group(1), int(found.group(2))
    if kind == "exitcode":
        return f"exit:{number}"
    try:
        return f"signal:{signal.Signals(number).name}"
    except ValueError:
        return f"signal:{number}"


def oom_kills(root: Path = _CGROUP_ROOT, membership: Path = _MEMBERSHIP) -> int | None:
    """The ``oom_kill`` count of this process's memory cgroup, or ``None`` if unknown:
    cgroup v2's ``memory.events``, else cgroup v1's ``memory.oom_control``."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        lines = []
    # "<id>:<controllers>:<path>": v2's line is "0::<path>", v1's memory one
    # "<id>:memory:<path>"; each path is relative to its hierarchy's mount.
    v2 = next((ln.split(":", 2)[2] for ln in lines if ln.startswith("0::")), "")
    v1 = next((ln.split(":", 2)[2] for ln in lines if ln.split(":")[1:2] == ["memory"]), "")
    for path in (
        root / v2.strip("/") / "memory.events",
        root / "memory.events",
        root / "memory" / v1.strip("/") / "memory.oom_control",
        root / "memory" / "memory.oom_control",
    ):
        try:
            text = path.read_text()
        except OSError:
            continue
        for row in text.splitlines():
            name, _, value = row.partition(" ")
            if name == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


class Deaths:
    """Names pool-process deaths for one worker's main process. Built when the worker
    starts, so an OOM kill counted before it is not blamed on a later SIGKILL."""

    def __init__(self, read: Callable[[], int | None] = oom_kills) -> None:
        self._read = read
        self._lock = threading.Lock()
        self._seen = read()

    def cause(self, exception: BaseException | None) -> str:
        """``oom``, ``signal:<NAME>``, ``exit:<code>``, or ``""`` when unknown."""
        found = exit_cause(exception)
        if found != "signal:SIGKILL":
            return found
        with self._lock:
            now = self._read()
            if now is None or self._seen is None:
                self._seen = now
                return found
            if now > self._seen:
                # One OOM kill accounts for one SIGKILL: a second kill reported with
                # the counter unchanged since is someone else's.
                self._seen += 1
                return "oom"
            self._seen = now
            return found
