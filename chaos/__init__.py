"""The chaos runner: scenarios of real faults against the testproject, with invariants.

``python -m chaos list`` names the scenarios; ``python -m chaos run <scenario>|all``
runs them, each against a fresh private Redis (AOF on, ``noeviction``), real prefork
Celery workers and the standalone resurrector, and prints an invariant report
(docs/chaos.md). From Python::

    from chaos import Options, SCENARIOS
    report = SCENARIOS["worker-kill"].run(Options(tasks=20))
    assert report.ok, report.render()
"""

from __future__ import annotations

from .runner import FULL_TASKS, SMALL_TASKS, Options
from .scenarios import SCENARIOS, Scenario

__all__ = ["FULL_TASKS", "SCENARIOS", "SMALL_TASKS", "Options", "Scenario"]
