"""One cell's run: the tasks it follows to their ends, the evidence, and the invariant.

A case pushes through its trigger, lets its fate act (``react``) while it waits, and
waits for every task it follows to reach an end: a commit, the cancelled outcome, or a
DLQ entry the fate leaves there. Each of the test's acts (a push, a kill, a release, a
cancel) restarts the fate's bound; a task still without its end when the bound runs
out is a failure, named with what the store shows of it. Then the invariant is read
from the evidence: the store (outcome records, DLQ entries, task hashes), the effects
the tasks made (Redis, or the shared database for the inbox) and the workflow records.
"""

from __future__ import annotations

import contextlib
import enum
import threading
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import transaction

from relier_django.core.model.idem_key import derive_key
from relier_django.core.store import workflows
from relier_django.core.store.receipt import DispatchState, Receipt
from testproject.demo import composition_tasks as tasks
from testproject.demo.composition_tasks import run_key

if TYPE_CHECKING:
    from .lab import Lab, State
    from .matrix import Cell, Transaction

POLL_S = 0.2


def transaction_of(value: Transaction) -> contextlib.AbstractContextManager[Any]:
    """Where a push of a cell with this transaction value is made."""
    return transaction.atomic() if value.outbox else contextlib.nullcontext()


class Expect(enum.Enum):
    COMMIT = "one commit"
    ENDED = "one commit, or a DLQ entry with a reason"
    CANCELLED = "the cancelled outcome"
    HELD = "a DLQ entry with reason 'cancelled', holding the rest of its workflow"
    NEVER = "not to exist: the task before it holds it"


@dataclass
class Followed:
    """A task the case follows to its end."""

    id: str
    role: str
    own: bool = False  # the cell's own task (its fate aims at it)
    behind: bool = False  # after the cell's task in its workflow
    atomic: bool = False  # its effect is a database row (the inbox)


@dataclass(frozen=True)
class Run:
    """One run of the cell's call, as the task noted it."""

    task_id: str
    fence: int
    attempt: int
    pid: int
    first: str  # what its first incarnation was told to do

    @property
    def key(self) -> str:
        return f"{self.task_id}:{self.fence}"

    @property
    def holds(self) -> bool:
        """It waits for its SIGKILL (a first incarnation told to hold)."""
        return self.fence == 1 and self.first == "hold"


class Case:
    def __init__(self, cell: Cell, lab: Lab, run: str, number: int = 0) -> None:
        self.cell, self.lab = cell, lab
        self.label = f"{run}.{cell.slug}"  # the call's argument: names the cell
        self.prefix = f"{run}.{number:03d}"  # of its task ids (a column holds 64 chars)
        self.started = self.acted = time.monotonic()  # the run, the test's last act
        self.deadline = self.started + cell.fate.bound_s
        self.notes: list[str] = []
        self.problems: list[str] = []
        self.tasks: dict[str, Followed] = {}
        self.lossy = False  # lost-reply cells arm drops for each task they announce
        self.armings: dict[str, dict[str, Any]] = {}
        self.killed: set[str] = set()  # runs (task:fence) SIGKILLed
        self.released: set[tuple[str, int | None]] = set()  # (task, fence) released
        self.cancelled: dict[str, Any] = {}  # task -> cancel()'s answer
        self.chain: list[str] = []
        self.members: list[str] = []
        self.callback: str | None = None
        self.workflow_id: str | None = None
        self.unresolved: dict[str, str] = {}  # outbox receipts of idempotent pushes
        self._lock = threading.Lock()

    # --- what the trigger asks -------------------------------------------------------
    @property
    def first(self) -> str:
        return self.cell.fate.first

    @property
    def queue(self) -> str:
        return self.cell.fate.queue

    @property
    def atomic(self) -> bool:
        return self.cell.transaction.atomic

    def announce(self, name: str) -> str:
        """The id of the cell's task called ``name``, before it is pushed."""
        return self.announce_id(f"{self.prefix}.{name}")

    def announce_id(self, task_id: str) -> str:
        if self.lossy and task_id not in self.armings:
            self.armings[task_id] = self.lab.arm_lost_replies(task_id)
        return task_id

    def around(self, task_id: str) -> dict[str, str]:
        """Options of a task of the cell's workflow that is not the cell's own."""
        return {"task_id": task_id, "queue": self.cell.fate.workflow_queue}

    def signature(self, task_id: str) -> Any:
        return self.cell.task.si(self.label, first=self.first).set(
            task_id=task_id, queue=self.queue
        )

    def transaction(self) -> contextlib.AbstractContextManager[Any]:
        return transaction_of(self.cell.transaction)

    def push_twin(self) -> None:
        """An idempotent cell's twin: the same call, pushed directly, just before."""
        if not self.cell.idempotency.idempotent:
            return
        twin = self.announce("twin")
        receipt = self.cell.task.apply_async(
            (self.label,), {"first": self.first}, task_id=twin, queue=self.queue
        )
        self.follow_receipt(receipt, "its twin", own=False)

    def follow_receipt(self, receipt: Receipt, role: str, own: bool = True) -> None:
        if receipt.dispatch_state in (DispatchState.PENDING, DispatchState.FAILED):
            self.problem(f"the push of {role} was not dispatched: {receipt.dispatch_state}")
        if receipt.dispatch_state is DispatchState.OUTBOX and self.cell.idempotency.idempotent:
            # Its outbox row holds it; the relay may find it a duplicate, which the
            # receipt cannot learn (docs/transactions.md): resolved from the store.
            self.unresolved[receipt.task_id] = role
            self.touch(f"pushed {role} ({receipt.dispatch_state})")
            return
        end = receipt.duplicate_of or receipt.task_id
        if receipt.deduplicated:
            self.note(f"the push of {role} was answered duplicate of {self.role_of(end)}")
        self.follow(end, role, own=own, atomic=self.atomic)
        self.touch(f"pushed {role} ({receipt.dispatch_state})")

    def follow(
        self, task_id: str, role: str, own: bool = False, behind: bool = False, atomic: bool = False
    ) -> None:
        with self._lock:
            known = self.tasks.get(task_id)
            if known is None:
                self.tasks[task_id] = Followed(task_id, role, own, behind, atomic)
            else:  # a duplicate's push ends with the task holding its key
                known.own, known.role = known.own or own, f"{known.role} (also {role}'s end)"

    def queue_behind(self, round_: int) -> str:
        """A plain task queued on the cell's queue in the instant its worker is killed."""
        task_id = self.announce(f"behind{round_}")
        tasks.work.apply_async((self.label,), task_id=task_id, queue=self.queue)
        self.follow(task_id, f"a task queued in the instant of kill {round_}")
        return task_id

    # --- what the fate and the lab ask ------------------------------------------------
    def followed(self) -> list[Followed]:
        with self._lock:
            return list(self.tasks.values())

    def role_of(self, task_id: str) -> str:
        task = self.tasks.get(task_id)
        return f"{task.role} {task_id}" if task else task_id

    def runs(self) -> list[Run]:
        runs = []
        for line in self.lab.redis.lrange(run_key(self.label), 0, -1):
            task_id, fence, attempt, pid, first = line.rsplit(":", 4)
            runs.append(Run(task_id, int(fence), int(attempt), int(pid), first))
        return runs

    def in_worker(self, hostname: str) -> list[str]:
        """The cell's tasks that worker ``hostname`` holds now (running or received), as
        ``task:fence``."""
        held = []
        for task in self.followed():
            state = self.lab.state(task.id)
            if state.worker and state.worker.startswith(f"{hostname}:"):
                held.append(f"{task.id}:{state.fence}")
        return held

    def holding(self) -> list[Run]:
        """The runs holding now, not yet killed: running at fence 1, told to hold."""
        return [
            run
            for run in self.runs()
            if run.holds and run.key not in self.killed and self.lab.running_at(run)
        ]

    def note(self, what: str) -> None:
        self.notes.append(f"+{time.monotonic() - self.started:.1f}s {what}")

    def touch(self, what: str) -> None:
        """The test acted on the cell: its bound starts again."""
        self.note(what)
        self.acted = time.monotonic()
        self.deadline = self.acted + self.cell.fate.bound_s

    def problem(self, what: str) -> None:
        self.problems.append(what)

    # --- the run ------------------------------------------------------------------
    def run(self) -> None:
        """Push, let the fate act, wait for the ends, check; a failure of the test
        itself is recorded as the cell's problem, never raised."""
        fate = self.cell.fate
        self.started = self.acted = time.monotonic()
        self.deadline = self.started + fate.bound_s
        try:
            fate.join(self)
            try:
                for _ in self.cell.trigger.fire(self):
                    self.settle(own_only=True)  # a wave: the cell's own tasks end first
            finally:
                fate.leave(self)
            self.settle()
            self.check()
        except Exception:  # reported as the cell's failure, never lost
            self.problem(f"the test itself failed:\n{traceback.format_exc()}")
        finally:
            from django.db import connections

            connections.close_all()  # this thread's

    def settle(self, own_only: bool = False) -> None:
        """Until every followed task (or each of the cell's own) has ended, or the
        bound ran out."""
        while not self.lab.stopping.is_set():
            self.cell.fate.react(self)
            self._resolve()
            waited = [t for t in self.followed() if t.own or not own_only]
            if not self.unresolved and all(self._ended(t) for t in waited):
                return
            if time.monotonic() > self.deadline:
                return
            time.sleep(POLL_S)

    def _resolve(self) -> None:
        """An outbox receipt's push ends under its own id once stored, or with the
        task holding its key once the relay dropped its row as a duplicate."""
        for task_id, role in list(self.unresolved.items()):
            state = self.lab.state(task_id)
            if state.exists or state.record or state.dlq:
                self.follow(task_id, role, own=True, atomic=self.atomic)
            elif self.lab.in_outbox(task_id):
                continue
            elif (holder := self.claim_holder()) and holder != task_id:
                self.note(f"the relay found the push of {role} a duplicate of {holder}")
                self.follow(holder, role, own=True, atomic=self.atomic)
            else:
                continue
            del self.unresolved[task_id]

    def _ended(self, task: Followed) -> bool:
        if self.expect(task) is Expect.NEVER:
            return True  # nothing to wait for: checked at the end
        state = self.lab.state(task.id)
        if state.record is not None and state.record["status"] in ("ok", "cancelled"):
            return True
        if state.dlq is None:
            return False
        # A failure the fate releases is not an end: its commit is.
        return not (self.cell.fate.releases and state.dlq.reason == "exception")

    def expect(self, task: Followed) -> Expect:
        if self.cell.fate.late and (task.own or task.behind):
            return Expect.ENDED
        if not self.cell.fate.cancels:
            return Expect.COMMIT
        if task.behind:
            return Expect.NEVER
        if task.own:
            return Expect.HELD if self.cell.trigger.holds_rest else Expect.CANCELLED
        return Expect.COMMIT

    # --- the invariant --------------------------------------------------------------
    def check(self) -> None:
        for task_id, role in self.unresolved.items():
            self.problem(
                f"the push of {role} {task_id}, left to the outbox, never reached the store "
                f"({'its row is still there' if self.lab.in_outbox(task_id) else 'no row'})"
            )
        for task in self.followed():
            self._check_task(task, self.expect(task))
        self._check_workflow()
        self._check_fault()

    def _check_task(self, task: Followed, expect: Expect) -> None:
        state = self.lab.state(task.id)
        effects = self.effects(task)
        seen = self.describe(task, state)
        record = state.record or {}
        if expect is Expect.NEVER:
            if state.exists or record:
                self.problem(f"{self.role_of(task.id)}: expected {expect.value}; {seen}")
            return
        if expect is Expect.ENDED and record.get("status") != "ok":
            if state.dlq is None or not self._ended(task):
                self.problem(f"{self.role_of(task.id)}: expected {expect.value}; {seen}")
            elif effects:
                self.problem(f"{self.role_of(task.id)}: in the DLQ, yet its effect was made")
            return
        if expect in (Expect.COMMIT, Expect.ENDED):
            if record.get("status") != "ok":
                self.problem(f"{self.role_of(task.id)}: expected {expect.value}; {seen}")
                return
            fence = record["result"].get("fence")
            if state.dlq is not None:
                self.problem(f"{self.role_of(task.id)}: committed and in the DLQ ({seen})")
            if effects != [fence]:
                self.problem(
                    f"{self.role_of(task.id)}: committed the result of fence {fence}, but its "
                    f"effect was made {len(effects)} time(s), by fence(s) {effects}"
                )
            return
        if expect is Expect.CANCELLED:
            wanted = record.get("status") == "cancelled" and state.dlq is None
        else:  # held: dead-lettered (its outcome record says failed), not committed
            wanted = state.dlq is not None and state.dlq.reason == "cancelled"
            wanted = wanted and record.get("status") != "ok"
        if not wanted:
            self.problem(f"{self.role_of(task.id)}: expected {expect.value}; {seen}")
        if effects:
            self.problem(f"{self.role_of(task.id)}: cancelled, yet its effect was made {effects}")

    def effects(self, task: Followed) -> list[int]:
        return self.lab.effects(self.label, task.id, task.atomic)

    def describe(self, task: Followed, state: State) -> str:
        """What the store shows of ``task``, in words, and why when it can tell."""
        record = state.record or {}
        if record.get("status") == "ok":
            return "it committed"
        if record.get("status") == "cancelled":
            return "it ended as the cancelled outcome (REVOKED), in no DLQ"
        if state.dlq is not None:
            return f"it is in the DLQ (reason {state.dlq.reason}, fence {state.dlq.fence})"
        late = (
            f"{time.monotonic() - self.acted:.1f} s after the test's last act on the cell "
            f"(bound {self.cell.fate.bound_s:g} s)"
        )
        if state.exists:
            seen = (
                f"still {state.state} at fence {state.fence}, {late}; queue {state.queue!r}, "
                f"runs {[r.key for r in self.runs() if r.task_id == task.id]}"
            )
            where = self.lab.queues_holding(task.id)
            if state.state == "queued" and not state.worker and not where:
                seen += (
                    "; its message is in no queue and no worker holds it (a consumer that "
                    "died took it): only QUEUED_GRACE_S brings it back"
                )
            return seen + (f"; its message waits in {where}" if where else "")
        if task.behind or task.id in self.chain[1:]:
            return f"it was never created (by the commit of the task before it), {late}"
        holder = self.claim_holder() if task.own else None
        if holder and holder != task.id:
            return (
                f"it was never stored, {late}: its push was answered duplicate of "
                f"{self.role_of(holder)} (the idempotency claim names it)"
            )
        return f"it was never stored, {late}"

    def claim_holder(self) -> str | None:
        """The task holding the idempotency key of the cell's call (None: no claim)."""
        spec = self.cell.task.relier_spec
        if not spec.idempotent:
            return None
        key = derive_key(spec.idempotency_key, (self.label,), {"first": self.first})
        holder = self.lab.redis.get(self.lab.keys.idempotency(spec.name, key))
        return str(holder) if holder else None

    def _result(self, task_id: str | None) -> Any:
        record = self.lab.state(task_id).record if task_id else None
        return record["result"] if record and record["status"] == "ok" else None

    def _check_workflow(self) -> None:
        if len(self.chain) == 3 and (last := self._result(self.chain[2])) is not None:
            before = self._result(self.chain[1])
            if last["previous"] != before:
                self.problem(f"the chain's last step got {last['previous']!r}, not {before!r}")
        if self.callback and (done := self._result(self.callback)) is not None:
            header = [self._result(m) for m in self.members]
            if done["results"] != header:
                self.problem(f"the chord's callback got {done['results']!r}, not {header!r}")
        if self.workflow_id is None:
            return
        view = workflows.read(self.lab.observe, self.workflow_id)
        if view is None:
            self.problem(f"no record of the workflow {self.workflow_id}")
        elif view.state == "PENDING" or (
            view.state != "SUCCESS" and not (self.cell.fate.cancels or self.cell.fate.late)
        ):
            steps = ", ".join(f"{self.role_of(s.task_id)}: {s.status.state}" for s in view.steps)
            self.problem(f"the workflow {self.workflow_id} is {view.state}: {steps}")

    def _check_fault(self) -> None:
        """The fault happened: a cell whose fault never landed proves nothing."""
        fate = self.cell.fate
        if fate.first == "hold" and not self.killed:
            self.problem(
                "nothing of the cell's was SIGKILLed: none of its tasks was running (held) "
                "in a pool process, or waiting in its worker, at a kill"
            )
        if fate.releases and not self.released:
            self.problem("nothing of the cell's went to the DLQ to be released")
        if fate.first == "retry" and not any(r.attempt > 1 for r in self.runs()):
            self.problem("no run of the cell's call was a retry")
        for task_id, drops in self.armings.items():
            if self._result(task_id) is not None and not drops["commit"].fired:
                self.problem(f"{self.role_of(task_id)} committed without losing commit.lua's reply")

    def report(self, repeat: str) -> str:
        lines = [f"{self.cell}:"]
        lines += [f"  - {p}" for p in self.problems]
        lines.append("  what the test did: " + "; ".join(self.notes))
        lines.append(f"  repeat: {repeat} (label {self.label})")
        return "\n".join(lines)
