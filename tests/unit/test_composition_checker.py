"""The composition test's checker (tests/composition/case.py) is not vacuous: fed
fabricated evidence of each way a cell can break the invariant, it reports each one.
(The matrix itself runs on real workers: tests/chaos/test_composition.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from relier_django.core.dlq.entries import Summary
from relier_django.core.store.keys import KeySpace
from tests.chaos.test_composition import FATES, FLOWS, IDEMPOTENCY, TRANSACTIONS, TRIGGERS
from tests.composition.case import Case
from tests.composition.lab import State
from tests.composition.matrix import Cell


def value(axis: list[Any], name: str) -> Any:
    return next(v for v in axis if v.name == name)


class Evidence:
    """What a lab would read from the store and the database, made up."""

    def __init__(self) -> None:
        self.keys = KeySpace("rl")
        self.states: dict[str, State] = {}
        self.made: dict[str, list[int]] = {}
        self.redis = self  # runs and claims: none

    def lrange(self, *_: Any) -> list[str]:
        return []

    def get(self, *_: Any) -> None:
        return None

    def state(self, task_id: str) -> State:
        return self.states.get(task_id, State(None, None, False, None, None, None, None))

    def effects(self, label: str, task_id: str, atomic: bool) -> list[int]:
        return self.made.get(task_id, [])

    def queues_holding(self, task_id: str) -> list[str]:
        return []

    def committed(self, task_id: str, fence: int) -> None:
        record = {"status": "ok", "result": {"fence": fence}, "fence": fence}
        self.states[task_id] = State(record, None, False, None, None, None, None)


def checked(evidence: Evidence, fate: str, trigger: str = "direct push", **tasks: dict) -> list:
    cell = Cell(
        value(TRIGGERS, trigger), value(IDEMPOTENCY, "plain"), value(TRANSACTIONS, "none"),
        value(FATES, fate), FLOWS[0],
    )  # fmt: skip
    case = Case(cell, evidence, "run")  # type: ignore[arg-type]
    case.killed, case.released = {"x:1"}, {("x", 1)}  # the fault landed
    for task_id, role in tasks.items():
        case.follow(task_id, **role)
    case.check()
    return case.problems


def dlq_entry(reason: str) -> Summary:
    return Summary("t", "t", "compose.work", reason, "celery", "", 1, 1, 1, 1)


def test_a_commit_whose_effect_was_made_twice_is_reported():
    evidence = Evidence()
    evidence.committed("t", 2)
    evidence.made["t"] = [1, 2]  # a killed run that had made its effect, then the commit's
    [problem] = checked(evidence, "commit", t={"role": "the task", "own": True})
    assert "effect was made 2 time(s), by fence(s) [1, 2]" in problem


def test_a_commit_whose_effect_another_incarnation_made_is_reported():
    evidence = Evidence()
    evidence.committed("t", 2)
    evidence.made["t"] = [1]
    [problem] = checked(evidence, "commit", t={"role": "the task", "own": True})
    assert "committed the result of fence 2" in problem


def test_a_commit_beside_a_dlq_entry_is_reported():
    evidence = Evidence()
    evidence.committed("t", 1)
    evidence.states["t"] = State(
        evidence.states["t"].record, dlq_entry("exception"), False, None, None, None, None
    )
    evidence.made["t"] = [1]
    [problem] = checked(evidence, "commit", t={"role": "the task", "own": True})
    assert "committed and in the DLQ" in problem


def test_a_task_that_never_ended_is_reported_with_what_the_store_shows():
    evidence = Evidence()
    evidence.states["t"] = State(None, None, True, "queued", "1", "celery", None)
    [problem] = checked(evidence, "commit", t={"role": "the task", "own": True})
    assert "expected one commit; still queued at fence 1" in problem
    assert "in no queue and no worker holds it" in problem


@pytest.mark.parametrize(
    ("trigger", "outcome", "complaint"),
    [
        ("chain head", "revoked", "expected a DLQ entry with reason 'cancelled'"),
        ("direct push", "dlq", "expected the cancelled outcome"),
    ],
)
def test_a_cancel_ending_otherwise_than_documented_is_reported(trigger, outcome, complaint):
    evidence = Evidence()
    record = {"status": "cancelled"} if outcome == "revoked" else {"status": "failed"}
    entry = dlq_entry("cancelled") if outcome == "dlq" else None
    evidence.states["t"] = State(record, entry, False, None, None, None, None)
    problems = checked(evidence, "cancel", trigger, t={"role": "the task", "own": True})
    assert any(complaint in p for p in problems), problems


def test_a_cancelled_task_whose_effect_was_made_is_reported():
    evidence = Evidence()
    evidence.states["t"] = State({"status": "cancelled"}, None, False, None, None, None, None)
    evidence.made["t"] = [1]
    [problem] = checked(evidence, "cancel", t={"role": "the task", "own": True})
    assert "cancelled, yet its effect was made" in problem


def test_a_step_that_a_cancelled_step_should_hold_but_exists_is_reported():
    evidence = Evidence()
    evidence.states["held"] = State(
        {"status": "failed"}, dlq_entry("cancelled"), False, None, None, None, None
    )
    evidence.states["next"] = State(None, None, True, "queued", "1", "celery", None)
    problems = checked(
        evidence, "cancel", "chain head",
        held={"role": "the head", "own": True}, next={"role": "the next step", "behind": True},
    )  # fmt: skip
    [problem] = problems
    assert problem.startswith("the next step next: expected not to exist: the task before it")


def test_a_fault_that_never_landed_fails_the_cell():
    evidence = Evidence()
    evidence.committed("t", 1)
    evidence.made["t"] = [1]
    cell = Cell(
        value(TRIGGERS, "direct push"), value(IDEMPOTENCY, "plain"), value(TRANSACTIONS, "none"),
        value(FATES, "pool process killed"), FLOWS[0],
    )  # fmt: skip
    case = Case(cell, evidence, "run")  # type: ignore[arg-type]
    case.follow("t", "the task", own=True)
    case.check()
    assert case.problems == [
        "nothing of the cell's was SIGKILLed: none of its tasks was running (held) in a "
        "pool process, or waiting in its worker, at a kill"
    ]
