"""Crash points: the boundaries an incarnation crosses, named, so that a test can kill
its process at each one (``relier_django.crashpoints``, docs/crash-testing.md).

The boundaries: a checkpoint saved, an inbox unit's database commit (before and
after), a push made, ``commit.lua`` (before and after). ``cross`` is a no-op unless a
hook is installed, which costs one global read per boundary; only a crash-testing
worker (the plugin's launcher) installs one, before Celery forks its pool. This module
imports nothing of relier's: every floor of the core may call it.
"""

from __future__ import annotations

from collections.abc import Callable

CHECKPOINT = "checkpoint"
BEFORE_INBOX_COMMIT = "before inbox commit"
AFTER_INBOX_COMMIT = "after inbox commit"
PUSH = "push"
BEFORE_COMMIT = "before commit.lua"
AFTER_COMMIT = "after commit.lua"
# A commit.lua that refused this incarnation's result (superseded): a boundary crossed,
# no commit made. Crash tests count commits by AFTER_COMMIT alone.
AFTER_REFUSED_COMMIT = "after a refused commit.lua"

Hook = Callable[[str, str, str], None]
"""``hook(boundary, task, detail)``: ``task`` is the crossing incarnation's task name
('' where it is not known: a push); ``detail`` names what was crossed (the pushed
task, the inbox unit)."""

_hook: Hook | None = None


def install(hook: Hook | None) -> None:
    """Call ``hook`` at every boundary this process crosses from now on (None: stop)."""
    global _hook
    _hook = hook


def cross(boundary: str, task: str = "", detail: str = "") -> None:
    """This process crosses ``boundary`` (one of this module's names). The hook may end
    the process here: that is what it is for."""
    hook = _hook
    if hook is not None:
        hook(boundary, task, detail)
