"""G15, composition: features run together, against a real Redis, real prefork workers
and PostgreSQL, over the explicit matrix below (docs/chaos.md, "The composition
matrix").

    trigger x idempotency x transaction x fate x flow

Each cell holds one invariant (tests/composition/case.py): every push ends in exactly
one commit, or exactly one DLQ entry with a reason, or the documented cancelled
outcome (a task that holds the rest of its workflow must wait in the DLQ with reason
``cancelled`` instead), within the fate's bound after the test's last act on the
cell; a committed task's effect (a database row for the inbox, an entry in Redis
otherwise) was made exactly once, by the incarnation whose result was committed; a
workflow completes (a chain's last step, a chord's callback, every group member) or
waits in the DLQ with a reason. After the run nothing is left in flight, queued, in the
outbox, or among the keys G7 allows.

**A new feature joins the matrix in the commit that adds it**: one line on the axis it
belongs to below (a value, and the function in tests/composition/ that makes it act),
or a new axis (a list below and a field of ``Cell``). A combination that cannot mean
anything goes in ``EXCLUDED`` with a one-line reason; none is dropped silently.

CI runs a covering sample (``CHAOS_COMPOSITION_SAMPLE``, 24 cells: every value of every
axis, then as many pairs as fit), its seed in the session header and in every failure
(``CHAOS_COMPOSITION_SEED`` repeats it); ``make chaos`` runs every cell. All the chosen
cells are in flight at once on shared workers (tests/composition/lab.py).
"""

from __future__ import annotations

import uuid

import pytest

import relier_django
from testproject.shared_db import SharedDatabase
from tests.composition import campaign as campaigns
from tests.composition import fates, sampling, triggers
from tests.composition.case import transaction_of
from tests.composition.lab import Lab
from tests.composition.matrix import (
    DEFAULT_QUEUE,
    DOOMED_QUEUE,
    LOSSY_QUEUE,
    PARKED_QUEUE,
    Cell,
    Exclusion,
    Fate,
    Flow,
    Idempotency,
    Matrix,
    Transaction,
    Trigger,
)

# --- the matrix ----------------------------------------------------------------------
TRIGGERS = [
    Trigger("direct push", triggers.direct, False, "push() now"),
    Trigger("countdown", triggers.countdown, False, "a push with a countdown (1.5 s), priority 9"),
    Trigger("periodic tick", triggers.periodic_tick, False, "two ticks of a beat_schedule entry"),
    Trigger("chain head", triggers.chain_head, True, "the first of a chain of three"),
    Trigger("chain step", triggers.chain_step, True, "the second, created by the first's commit"),
    Trigger("chord member", triggers.chord_member, True, "the second of a chord's three"),
    Trigger("group member", triggers.group_member, False, "the second of a group of three"),
    Trigger(
        "send_task by name",
        triggers.send_task_by_name,
        False,
        "app.send_task(name, args): Celery's own message, adopted by the worker",
    ),
    Trigger("debounce", triggers.debounced, False, "the last of two debounced pushes (2.5 s)"),
    Trigger(
        "chain in chord", triggers.chain_in_chord, True,
        "the first step of a chain of two, a chord header's second member",
    ),
    Trigger(
        "chord in chain", triggers.chord_in_chain, True,
        "the second member of a group inside a chain (a chord the step before creates)",
    ),
    Trigger(
        "link callback", triggers.linked_callback, False,
        "a link= callback, created by its parent's commit",
    ),
    Trigger(
        "linked parent", triggers.linked_parent, False,
        "a task with a link= callback (its commit creates it) and a link_error= errback "
        "(its filing in the DLQ creates it); cancelled, it creates neither",
    ),
]  # fmt: skip
IDEMPOTENCY = [
    Idempotency("plain", False, "a task without idempotency"),
    Idempotency(
        "idempotent", True, "idempotent=True; the same call was pushed just before (its twin)"
    ),
]
TRANSACTIONS = [
    Transaction("inbox", True, False, "@rl_task(atomic=True): the body writes a database row"),
    Transaction("outbox", False, True, "pushed inside transaction.atomic(), OUTBOX on"),
    Transaction("none", False, False, "pushed outside any transaction"),
]
# fmt: off
FATES = [
    Fate("commit", "", DEFAULT_QUEUE, fates.nothing, 20, "runs once and commits"),
    Fate("retry", "retry", DEFAULT_QUEUE, fates.nothing, 20, "fails once (retry_on), commits"),
    Fate(
        "DLQ and release", "fail", DEFAULT_QUEUE, fates.release_failures, 20,
        "fails into the DLQ; released, it commits", releases=True,
    ),
    Fate(
        "late release", "fail", DEFAULT_QUEUE, fates.release_late, 20,
        "fails into the DLQ; released after its workflow's 7-day state expired",
        releases=True, late=True,
    ),
    Fate(
        "out of memory", "oom", DEFAULT_QUEUE, fates.release_oom, 20,
        "runs out of memory (MemoryError): an oom death, in the DLQ at once by its "
        "max_resurrections' {\"oom\": 0}; released, it commits", releases=True,
    ),
    Fate(
        "cancel", "", PARKED_QUEUE, fates.cancel_before_start, 20,
        "cancelled before it starts", join=fates.park, leave=fates.unpark, cancels=True,
    ),
    Fate(
        "pool process killed", "hold", DEFAULT_QUEUE, fates.kill_pool_process, 20,
        "its pool process SIGKILLed while it runs",
    ),
    Fate(
        "worker killed", "hold", DOOMED_QUEUE, fates.nothing, 30,
        "its whole worker SIGKILLed while it runs or waits there, a task queued in "
        "that instant; restarted",
        join=fates.doom, leave=fates.spare,
    ),
    Fate(
        "lost reply", "", LOSSY_QUEUE, fates.nothing, 20,
        "push.lua, start.lua, commit.lua each lose their reply once, for each task",
        workflow_queue=LOSSY_QUEUE, join=fates.arm_lost_replies,
    ),
]
FLOWS = [
    Flow("unlimited", "", "no flow control"),
    Flow(
        "concurrency", "concurrency",
        "concurrency=1 keyed by the cell: its tasks take the one slot in turn, in push order",
    ),
    Flow("rate", "rate", "rate='1/s' keyed by the cell: a second push waits for its turn"),
]
EXCLUDED = [
    Exclusion(
        {"trigger": "periodic tick", "transaction": "outbox"},
        "a tick is pushed by a scanner, never inside a user's transaction: it has no "
        "outbox row (an atomic=True entry is the inbox cell)",
    ),
    Exclusion(
        {
            "trigger": ("direct push", "countdown", "periodic tick", "chain head", "chain step",
                        "group member", "send_task by name", "link callback", "linked parent"),
            "fate": "late release",
        },
        "only a chord keeps state with a TTL that a release can outlive (a chain carries "
        "its steps in its envelope; results and claims expire from their commit)",
    ),
    Exclusion(
        {"trigger": "send_task by name", "idempotency": "idempotent"},
        "a message sent by name carries no idempotency key: it is adopted under its "
        "Celery id only (docs/api.md, sending by name)",
    ),
    Exclusion(
        {"trigger": "send_task by name", "transaction": "outbox"},
        "send_task publishes at once, to the broker: no outbox row, no transaction",
    ),
    Exclusion(
        {"trigger": "send_task by name", "flow": ("concurrency", "rate")},
        "flow control is applied at push; an adopted message is not gated (documented)",
    ),
    Exclusion(
        {"trigger": "send_task by name", "fate": ("cancel", "lost reply")},
        "a parked message is stored only when a worker adopts it, so there is nothing to "
        "cancel before; the lost-reply fate drops push.lua's reply, which a message sent "
        "by name never calls (adopt.lua's lost reply: tests/integration/test_replay.py)",
    ),
    Exclusion(
        {"trigger": "debounce", "idempotency": "idempotent"},
        "an idempotent task cannot be debounced (push raises ValueError): its second push "
        "would be the first's duplicate, superseding nothing",
    ),
    Exclusion(
        {"trigger": "debounce", "fate": "late release"},
        "only a chord keeps state with a TTL that a release can outlive",
    ),
]
# fmt: on
MATRIX = Matrix(TRIGGERS, IDEMPOTENCY, TRANSACTIONS, FATES, FLOWS, EXCLUDED)

PLAN = sampling.plan()
CHOSEN = MATRIX.chosen(PLAN)
# The run's fixture starts workers and runs every chosen cell: its time counts in the
# first test's, and the full matrix takes minutes.
pytestmark = pytest.mark.timeout(300 + 6 * len(CHOSEN))


@pytest.fixture(scope="module")
def lab(redis_server, postgres_server, tmp_path_factory, django_db_blocker):
    """Workers, the proxy and a shared PostgreSQL database for the module."""
    redis_server.client().flushall()
    directory = tmp_path_factory.mktemp("composition")
    db = SharedDatabase.create("pg", directory, postgres_server)
    try:
        with django_db_blocker.unblock(), Lab.running(redis_server, directory, db) as lab:
            yield lab
    finally:
        db.drop()


@pytest.fixture(scope="module")
def campaign(lab, request):
    # The cells of the tests pytest selected (``-k chord-member`` runs those alone).
    selected = {
        item.callspec.params["cell"]
        for item in request.session.items
        if hasattr(item, "callspec") and "cell" in item.callspec.params
    }
    done = campaigns.run(lab, [cell for cell in CHOSEN if cell in selected], PLAN)
    print(done.summary())
    if any(case.problems for case in done.cases.values()):
        print(f"worker logs: {lab.directory}")
    return done


@pytest.mark.parametrize("cell", CHOSEN, ids=lambda cell: cell.slug)
def test_every_push_ends_once_within_its_bound(campaign, cell):
    case = campaign.cases[cell]
    assert not case.problems, case.report(PLAN.repeat())


def test_nothing_is_left_in_flight_or_behind(campaign):
    assert not campaign.leftovers, f"after the run ({PLAN.repeat()}):\n" + "\n".join(
        campaign.leftovers
    )


@pytest.mark.parametrize("transaction_", TRANSACTIONS, ids=lambda t: t.name)
def test_a_reused_task_id_runs_the_new_tasks_body(lab, transaction_):
    # A caller-chosen id is free again once its outcome is gone (RESULT_TTL_S passed:
    # here its result key is deleted). A push under it is a new task: its own body runs.
    cell = Cell(TRIGGERS[0], IDEMPOTENCY[0], transaction_, FATES[0], FLOWS[0])
    task_id = f"reused.{transaction_.name}.{uuid.uuid4().hex[:6]}"
    labels = [f"{task_id}.first", f"{task_id}.second"]
    results = []
    for label in labels:
        with transaction_of(transaction_):
            cell.task.apply_async((label,), task_id=task_id)
        results.append(relier_django.result(task_id).get(timeout=20))
        lab.redis.delete(lab.keys.result(task_id))
    assert results[0]["label"] == labels[0]
    assert results[1]["label"] == labels[1], (
        f"{transaction_.name}: the second task under id {task_id} committed {results[1]}, "
        "not its own result: its body did not run"
    )
    made = [lab.effects(label, task_id, transaction_.atomic) for label in labels]
    assert made == [[1], [1]], f"effects (fences) of the first and the second task: {made}"
