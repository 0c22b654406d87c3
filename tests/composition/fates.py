"""What each fate of the matrix does to a cell (the ``Fate`` values of ``matrix.py``).

A fate's ``react`` is called again and again while its cell waits for its ends, and
acts on what it finds: a run to kill, a DLQ entry to release, a parked task to cancel.
So it needs no schedule of its own, and it acts on every run of the cell's call: the
cell's own task and, for an idempotent cell, its twin (which one runs depends on
idempotency, which is what the matrix tests). The whole-worker kill is the lab's
(``lab.Killer``): one worker holds every such cell's tasks, and one SIGKILL takes them
all, with the messages queued behind them.
"""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING

from relier_django import Cancelled, cancel
from relier_django import dlq as relier_dlq

if TYPE_CHECKING:
    from .case import Case

UNSTARTED = ("queued", "scheduled", "parked")  # parked: waiting for a flow-control slot


def nothing(case: Case) -> None:
    """No fault: the task runs to its end (its first incarnation was told what to do)."""


def release_failures(case: Case, reason: str = "exception") -> None:
    """Release each DLQ entry the cell's tasks made by failing (``exception``), once per
    failure (its fence)."""
    for task in case.followed():
        entry = case.lab.dlq_summary(task.id)
        if entry is None or entry.reason != reason or (task.id, entry.fence) in case.released:
            continue
        relier_dlq.release_entry(entry.id, expected_fence=entry.fence)
        case.released.add((task.id, entry.fence))
        case.touch(f"released {task.role} from the DLQ (fence {entry.fence})")


def release_oom(case: Case) -> None:
    """Release each DLQ entry the cell's tasks made by running out of memory: an ``oom``
    death their ``{"oom": 0}`` quarantined at once (``resurrection_limit``)."""
    release_failures(case, "resurrection_limit")


def release_late(case: Case) -> None:
    """Release each failure as :func:`release_failures` does, but late: weeks after, when
    whatever its workflow keeps with a TTL has expired (a chord's state kept 7 days
    from its last write; deleted here if it has a TTL at all)."""
    state = case.lab.keys.chord(case.workflow_id)
    if case.callback is not None and case.lab.redis.pttl(state) > 0:
        case.lab.redis.delete(state)
        case.touch("expired the chord's state (its TTL passed)")
    release_failures(case)


def cancel_before_start(case: Case) -> None:
    """Cancel each of the cell's own tasks once it exists and before it starts (it waits
    in the parked queue, which no worker reads yet; a countdown's in the schedule)."""
    for task in case.followed():
        if not task.own or task.id in case.cancelled:
            continue
        state = case.lab.task_state(task.id)
        if state in UNSTARTED:
            answer = cancel(task.id)
            case.cancelled[task.id] = answer
            case.touch(f"cancelled {task.role} while {state}: {answer.name}")
            if answer is not Cancelled.BEFORE_START:
                case.problem(f"cancel of {task.role} while {state} answered {answer.name}")


def kill_pool_process(case: Case) -> None:
    """SIGKILL the pool process of each first incarnation of the cell's call, while it
    holds (before its effect)."""
    for run in case.holding():
        if not case.lab.is_pool_process(run.pid):
            continue  # not a process the lab started: never signalled
        os.kill(run.pid, signal.SIGKILL)
        case.killed.add(run.key)
        case.touch(
            f"SIGKILLed pool process {run.pid} running {case.role_of(run.task_id)} (fence 1)"
        )


def park(case: Case) -> None:
    case.lab.parked.join(case)


def unpark(case: Case) -> None:
    case.lab.parked.leave(case)


def doom(case: Case) -> None:
    case.lab.killer.join(case)  # waits while the doomed worker has its fill of cells
    case.touch(f"joined the cells of worker {case.lab.doomed.name}")


def spare(case: Case) -> None:
    case.lab.killer.leave(case)


def arm_lost_replies(case: Case) -> None:
    case.lossy = True  # each task id the cell announces gets its drops armed
