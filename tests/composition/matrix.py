"""The parts of the composition matrix (G15): its values, its cells and what is left
out. The matrix itself, its axes and its exclusions, is written out in
``tests/chaos/test_composition.py``, where a reader sees all of it.

An axis is a list of named values; a value is a small frozen object that says what it
does: a trigger pushes and a fate injects its fault, through the functions of
``triggers.py`` and ``fates.py``; idempotency, transaction and flow choose the task
called (its options) and where its push is made. A cell takes one value of each axis
(:class:`Cell`, in the axes' order). A combination that cannot mean anything is an
:class:`Exclusion` with its reason, never dropped silently.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from testproject.demo import composition_tasks as tasks

from . import fates
from .sampling import Plan, covering_sample

if TYPE_CHECKING:
    from .case import Case

# Queues: the workers of lab.py consume them (each also the recovery queue).
DEFAULT_QUEUE = "celery"  # two workers
LOSSY_QUEUE = "compose.lossy"  # a worker whose store connection runs through the proxy
DOOMED_QUEUE = "compose.doomed"  # a worker SIGKILLed (and restarted) while it holds tasks
PARKED_QUEUE = "compose.parked"  # no worker until the cancels are made


@dataclass(frozen=True)
class Idempotency:
    name: str
    idempotent: bool
    summary: str


@dataclass(frozen=True)
class Transaction:
    name: str
    atomic: bool  # the task's body and its effect run in the fenced inbox
    outbox: bool  # the trigger pushes inside transaction.atomic(), the outbox on
    summary: str


@dataclass(frozen=True)
class Flow:
    name: str
    variant: str  # the task's flow control: "" (none), "concurrency" or "rate"
    summary: str


@dataclass(frozen=True)
class Trigger:
    name: str
    # Makes the cell's pushes; yields after each wave (a periodic entry's ticks come one
    # after the other: the second is fired once the first has settled).
    fire: Callable[[Case], Iterator[None]]
    # The task has tasks after it in its workflow: cancelled, it must wait in the DLQ
    # (reason cancelled) holding them, not end its workflow silently.
    holds_rest: bool
    summary: str


@dataclass(frozen=True)
class Fate:
    name: str
    first: str  # what the task's first incarnation does (composition_tasks.py)
    queue: str  # where the task (and its idempotent twin) is routed
    react: Callable[[Case], None]  # the fault, called while the cell waits for its ends
    bound_s: float  # every end is reached this long after the test's last act
    summary: str
    workflow_queue: str = DEFAULT_QUEUE  # where the rest of its workflow goes
    join: Callable[[Case], None] = fates.nothing  # before the trigger
    leave: Callable[[Case], None] = fates.nothing  # after the trigger's waves settled
    releases: bool = False  # its DLQ entries are released: the end is the commit after
    cancels: bool = False  # the end is the cancelled outcome (or the DLQ, see Trigger)
    # Its workflow may lose state before the test acts: each of its tasks ends in a
    # commit or in the DLQ with a reason, and the workflow completes or waits there.
    late: bool = False


@dataclass(frozen=True)
class Cell:
    trigger: Trigger
    idempotency: Idempotency
    transaction: Transaction
    fate: Fate
    flow: Flow

    def values(self) -> tuple[Any, ...]:
        return (self.trigger, self.idempotency, self.transaction, self.fate, self.flow)

    def __str__(self) -> str:
        return ", ".join(v.name for v in self.values())

    @property
    def slug(self) -> str:
        return ".".join(v.name.replace(" ", "-").lower() for v in self.values())

    @property
    def task(self) -> Any:
        """The ``@rl_task`` this cell's call is made to."""
        return tasks.declared(
            self.idempotency.idempotent, self.transaction.atomic, self.flow.variant
        )


@dataclass(frozen=True)
class Exclusion:
    """Every cell whose values are among the ones named here (axis -> a value's name, or
    a tuple of names) is left out."""

    where: dict[str, str | tuple[str, ...]]
    reason: str

    def names(self, axis: str) -> tuple[str, ...]:
        named = self.where[axis]
        return (named,) if isinstance(named, str) else named

    def matches(self, cell: Cell) -> bool:
        return all(getattr(cell, axis).name in self.names(axis) for axis in self.where)


@dataclass(frozen=True)
class Matrix:
    """The axes (in :class:`Cell`'s order) and the combinations left out."""

    trigger: list[Trigger]
    idempotency: list[Idempotency]
    transaction: list[Transaction]
    fate: list[Fate]
    flow: list[Flow]
    excluded: list[Exclusion]

    def axes(self) -> dict[str, list[Any]]:
        names = ("trigger", "idempotency", "transaction", "fate", "flow")
        return {name: getattr(self, name) for name in names}

    def _every(self) -> list[Cell]:
        return [Cell(*values) for values in itertools.product(*self.axes().values())]

    @property
    def cells(self) -> list[Cell]:
        return [c for c in self._every() if not any(x.matches(c) for x in self.excluded)]

    def left_out(self) -> list[tuple[Cell, str]]:
        """Every cell left out, with the reason of the first exclusion that names it."""
        out = []
        for cell in self._every():
            reasons = [x.reason for x in self.excluded if x.matches(cell)]
            if reasons:
                out.append((cell, reasons[0]))
        return out

    def chosen(self, plan: Plan) -> list[Cell]:
        """The cells ``plan`` takes: a covering sample, or all of them."""
        cells = self.cells
        by_values = {cell.values(): cell for cell in cells}
        sample = covering_sample([c.values() for c in cells], plan.size, plan.seed)
        return [by_values[values] for values in sample]
