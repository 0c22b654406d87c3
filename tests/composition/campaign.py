"""A run of the chosen cells, all in flight together on the lab's workers.

Each cell runs in a thread of its own. At most ``ACTIVE`` cells run at once (besides
the cancel cells, which all start first: the parked queue's worker waits for all of
their cancels), so a cell's bound measures relier, not a queue of a hundred cells on
four pool processes.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .case import Case
from .lab import Lab
from .matrix import Cell
from .sampling import Plan

ACTIVE = 24


@dataclass
class Campaign:
    plan: Plan
    cases: dict[Cell, Case]
    leftovers: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    def summary(self) -> str:
        failed = [c for c in self.cases.values() if c.problems]
        lines = [
            f"composition matrix: {len(self.cases)} cell(s), {len(failed)} failed, "
            f"{self.elapsed_s:.0f} s; repeat with {self.plan.repeat()}"
        ]
        lines += [f"  FAIL {case.cell}" for case in failed]
        return "\n".join(lines)


def run(lab: Lab, cells: Sequence[Cell], plan: Plan) -> Campaign:
    token = uuid.uuid4().hex[:6]
    cases = {cell: Case(cell, lab, token, n) for n, cell in enumerate(cells)}
    cancels = [c for c in cases.values() if c.cell.fate.cancels]
    others = [c for c in cases.values() if not c.cell.fate.cancels]
    lab.parked.expect(len(cancels))
    started = time.monotonic()
    with ThreadPoolExecutor(len(cancels) + ACTIVE, thread_name_prefix="cell") as pool:
        futures = [pool.submit(case.run) for case in [*cancels, *others]]
        try:
            for future in futures:
                future.result()
        except BaseException:  # an interrupt: every cell stops waiting, the pool drains
            lab.stopping.set()
            raise
    campaign = Campaign(plan, cases, elapsed_s=time.monotonic() - started)
    campaign.leftovers = lab.leftovers()
    for coordinator in (lab.killer, lab.parked):
        campaign.leftovers += [
            f"{type(coordinator).__name__} failed: {e!r}" for e in coordinator.errors
        ]
    return campaign
