"""How each trigger of the matrix pushes a cell's call (the ``Trigger`` values of
``matrix.py``).

Each trigger first announces every task id it is about to create (so a lost-reply cell
arms its drops before the push), pushes, inside the cell's transaction when it has one,
and follows each task to its expected end: the cell's own task (``own``), the tasks its
workflow holds behind it (``behind``: a chain's later steps, a chord's callback), and
the rest. Ids are chosen up front (Celery's ``task_id`` option), so a workflow's tasks
are known before they exist. An idempotent cell's twin is pushed first, directly.

A trigger is a generator: it yields after each wave of pushes, and the cell settles
that wave before the next (the second tick of a periodic entry is fired once the
first has ended, as the scanner would fire it a period later).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from celery import chain, chord, group

from relier_django.core.model.timing import Debounce, Timing
from relier_django.core.push import producer
from relier_django.core.schedule import periodic
from testproject.celery import app
from testproject.demo import composition_tasks as tasks

if TYPE_CHECKING:
    from .case import Case

COUNTDOWN_S = 1.5
DEBOUNCE_MS = 2_500


def _push_now(case: Case, **options: Any) -> None:
    case.push_twin()
    own = case.announce("own")
    with case.transaction():
        receipt = case.cell.task.apply_async(
            (case.label,), {"first": case.first}, task_id=own, queue=case.queue, **options
        )
    case.follow_receipt(receipt, "the cell's task")
    yield


def direct(case: Case) -> Iterator[None]:
    yield from _push_now(case)


def countdown(case: Case) -> Iterator[None]:
    # With a priority too: every incarnation (dispatch when due, retry, resurrection,
    # release) is queued on that level's list, the recovery queue's included.
    yield from _push_now(case, countdown=COUNTDOWN_S, priority=9)


def send_task_by_name(case: Case) -> Iterator[None]:
    """Celery's own message, sent by name with raw arguments (no envelope, nothing
    stored): the worker that receives it adopts it (docs/api.md, "Sending by name")."""
    own = case.announce("own")
    app.send_task(
        case.cell.task.name, (case.label,), {"first": case.first}, task_id=own, queue=case.queue
    )
    case.follow(own, "the cell's task, sent by name", own=True, atomic=case.atomic)
    case.touch("sent it by name")
    yield


def periodic_tick(case: Case) -> Iterator[None]:
    """Two ticks of an entry made for the cell (1 s interval), fired by this process
    as a scanner fires them (``fire_due``: claim, push under the tick's id, record)."""
    entry = f"compose-{case.label}"
    spec = {
        "task": case.cell.task.name,
        "schedule": 1.0,
        "args": (case.label,),
        "kwargs": {"first": case.first},
        "options": {"queue": case.queue},
    }
    for n in (1, 2):
        with case.lab.periodic.firing(entry, spec) as tick_ms:
            tick_id = periodic.tick_id(entry, tick_ms)
            case.announce_id(tick_id)
        case.follow(tick_id, f"tick {n} of its periodic entry", own=True, atomic=case.atomic)
        case.touch(f"fired tick {n}")
        yield


def _steps(case: Case, own_at: int) -> list[Any]:
    """A chain of three with the cell's task at ``own_at``; the others plain."""
    sigs: list[Any] = []
    for position in range(3):
        if position == own_at:
            sigs.append(case.signature(case.announce("own")))
        elif position == 2:  # gets the step before's result
            sigs.append(tasks.tail.s(case.label).set(**case.around(case.announce("tail"))))
        else:
            step = tasks.neighbour.si(case.label, position)
            sigs.append(step.set(**case.around(case.announce(f"step{position}"))))
    return sigs


def _follow_chain(case: Case, sigs: list[Any], own_at: int) -> None:
    names = ["the chain's first step", "the chain's second step", "the chain's last step"]
    for position, sig in enumerate(sigs):
        own = position == own_at
        name = f"{names[position]} (the cell's task)" if own else names[position]
        case.follow(sig.id, name, own=own, behind=position > own_at, atomic=own and case.atomic)
    case.chain = [sig.id for sig in sigs]
    case.workflow_id = sigs[0].id


def _chain(case: Case, own_at: int) -> Iterator[None]:
    case.push_twin()
    sigs = _steps(case, own_at)
    with case.transaction():
        chain(*sigs).apply_async()
    _follow_chain(case, sigs, own_at)
    case.touch("pushed the chain")
    yield


def chain_head(case: Case) -> Iterator[None]:
    yield from _chain(case, 0)


def chain_step(case: Case) -> Iterator[None]:
    yield from _chain(case, 1)


def _members(case: Case) -> list[Any]:
    """Three members, the cell's task the second."""
    return [
        tasks.neighbour.si(case.label, 0).set(**case.around(case.announce("member0"))),
        case.signature(case.announce("own")),
        tasks.neighbour.si(case.label, 2).set(**case.around(case.announce("member2"))),
    ]


def _follow_members(case: Case, members: list[Any]) -> None:
    for position, sig in enumerate(members):
        own = position == 1
        name = f"member {position}" + (" (the cell's task)" if own else "")
        case.follow(sig.id, name, own=own, atomic=own and case.atomic)
    case.members = [sig.id for sig in members]


def chord_member(case: Case) -> Iterator[None]:
    case.push_twin()
    members = _members(case)
    callback = tasks.collect.s(case.label).set(**case.around(case.announce("callback")))
    with case.transaction():
        result = chord(members)(callback)
    _follow_members(case, members)
    case.follow(callback.id, "the chord's callback", behind=True)
    case.callback, case.workflow_id = callback.id, result.parent.id
    case.touch("pushed the chord")
    yield


def group_member(case: Case) -> Iterator[None]:
    case.push_twin()
    members = _members(case)
    with case.transaction():
        result = group(members).apply_async()
    _follow_members(case, members)
    case.workflow_id = result.id
    case.touch("pushed the group")
    yield


def debounced(case: Case) -> Iterator[None]:
    """Two debounced pushes of one key (the cell's label), one after the other: the
    first is superseded by the second, the cell's task, which runs. ``push_with`` takes
    no task id or queue, so this calls the producer it wraps with them."""
    case.push_twin()
    first, own = case.announce("superseded"), case.announce("own")
    spec, window = case.cell.task.relier_spec, Debounce(DEBOUNCE_MS, case.label)
    receipts = []
    with case.transaction():
        for task_id in (first, own):
            receipts.append(producer.push(
                spec, case.cell.task.app, (case.label,), {"first": case.first}, task_id=task_id,
                queue=case.queue, when=Timing(countdown_ms=DEBOUNCE_MS), debounce=window,
            ))  # fmt: skip
    case.follow_receipt(receipts[1], "the cell's task (the last debounced push)")
    yield
    record = case.lab.state(first).record or {}
    if record.get("status") != "superseded" or record.get("by") != own:
        case.problem(f"the first debounced push {first}: expected superseded by {own}, "
                     f"the store shows {record or 'no outcome'}")  # fmt: skip
    if any(run.task_id == first for run in case.runs()):
        case.problem(f"the first debounced push {first} ran, though superseded")


def linked_callback(case: Case) -> Iterator[None]:
    """The cell's task as a ``link=`` callback of a plain parent: created by the
    parent's commit, in the same script (docs/workflows.md#links)."""
    case.push_twin()
    parent, own = case.announce("parent"), case.announce("own")
    with case.transaction():
        tasks.neighbour.apply_async(
            (case.label, 0), link=case.signature(own), **case.around(parent)
        )
    case.follow(parent, "the parent (its commit creates the cell's task)")
    case.follow(own, "the parent's callback (the cell's task)", own=True, atomic=case.atomic)
    case.touch("pushed the parent")
    yield


def linked_parent(case: Case) -> Iterator[None]:
    """The cell's task with a ``link=`` callback (created by its commit, given its
    result) and a ``link_error=`` errback (created only by its filing in the DLQ). An
    idempotent cell's push is its twin's duplicate, which runs nothing, its links
    included (docs/workflows.md#links): checked once the wave settled."""
    case.push_twin()
    own, callback, errback = (case.announce(n) for n in ("own", "callback", "errback"))
    on_success = tasks.tail.s(case.label).set(**case.around(callback))
    on_error = tasks.neighbour.si(case.label, 9).set(**case.around(errback))
    with case.transaction():
        receipt = case.cell.task.apply_async(
            (case.label,), {"first": case.first}, task_id=own, queue=case.queue,
            link=on_success, link_error=on_error,
        )  # fmt: skip
    case.follow_receipt(receipt, "the cell's task (with a link and a link_error)")
    duplicate = case.cell.idempotency.idempotent
    if not duplicate:
        case.follow(callback, "its callback (link=)", behind=True)
        if case.cell.fate.releases:  # filed in the DLQ once: its errback is created then
            case.follow(errback, "its errback (link_error=)")
    case.touch("pushed the linked task")
    yield
    if duplicate:
        _check_a_duplicates_links(case, own, callback, errback)
        return
    done, got = case._result(own), case._result(callback)
    while done is not None and got is None and time.monotonic() < case.deadline:
        time.sleep(0.2)  # the commit created it: it runs within the bound
        got = case._result(callback)
    if done is not None and got is not None and got["previous"] != done:
        case.problem(f"the callback got {got['previous']!r}, not the task's result {done!r}")
    if not case.cell.fate.releases and _created(case, errback):
        case.problem("its errback was created, though the task never went to the DLQ")


def _created(case: Case, task_id: str) -> bool:
    state = case.lab.state(task_id)
    return bool(state.exists or state.record or state.dlq)


def _check_a_duplicates_links(case: Case, own: str, callback: str, errback: str) -> None:
    """An idempotent cell's push: a duplicate of its twin creates neither link; a push
    that ran after all (the twin's key released first) created its callback once."""
    if not _created(case, own):
        for task_id, name in ((callback, "callback"), (errback, "errback")):
            if _created(case, task_id):
                case.problem(f"its {name} was created, though its push was a duplicate")
        return
    case.note("the cell's push ran under its own id (not a duplicate)")
    case.follow(callback, "its callback (link=)", behind=True)


def chain_in_chord(case: Case) -> Iterator[None]:
    """The cell's task the first step of a chain of two that is the second member of a
    chord's header of three: the chain's last step fills its place."""
    case.push_twin()
    members = _members(case)
    chain_last = tasks.tail.s(case.label).set(**case.around(case.announce("chainlast")))
    callback = tasks.collect.s(case.label).set(**case.around(case.announce("callback")))
    header = [members[0], chain(members[1], chain_last), members[2]]
    with case.transaction():
        result = chord(header)(callback)
    names = ["member 0", "member 1, a chain's first step (the cell's task)", "member 2"]
    for position, sig in enumerate(members):
        own = position == 1
        case.follow(sig.id, names[position], own=own, atomic=own and case.atomic)
    case.follow(chain_last.id, "member 1's last step", behind=True)
    case.follow(callback.id, "the chord's callback", behind=True)
    case.members = [members[0].id, chain_last.id, members[2].id]
    case.callback, case.workflow_id = callback.id, result.parent.id
    case.touch("pushed the chord with a chain in its header")
    yield


def chord_in_chain(case: Case) -> Iterator[None]:
    """The cell's task the second member of a group inside a chain (Celery's chord, its
    callback the step after the group, then one more step): the header is created by
    the commit of the step before it."""
    case.push_twin()
    first = tasks.neighbour.si(case.label, 9).set(**case.around(case.announce("step0")))
    members = _members(case)
    callback = tasks.collect.s(case.label).set(**case.around(case.announce("callback")))
    after = tasks.tail.s(case.label).set(**case.around(case.announce("tail")))
    with case.transaction():
        chain(first, group(members), callback, after).apply_async()
    case.follow(first.id, "the chain's first step (its commit creates the header)")
    _follow_members(case, members)
    case.follow(callback.id, "the chord's callback", behind=True)
    case.follow(after.id, "the step after the callback", behind=True)
    case.callback, case.workflow_id = callback.id, first.id
    case.touch("pushed the chain with a group inside")
    yield
    done, got = case._result(callback), case._result(after)
    if done is not None and got is not None and got["previous"] != done:
        case.problem(f"the step after the callback got {got['previous']!r}, not {done!r}")
