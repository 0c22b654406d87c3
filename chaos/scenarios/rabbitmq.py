"""RabbitMQ as Celery's broker, the store on Redis (issue #28): worker SIGKILLs, a zombie
pool process and a RabbitMQ node crash, in one run, on quorum queues.

Quorum queues, not classic ones: they are what RabbitMQ offers for messages that must
survive a node's loss (classic mirrored queues are gone in RabbitMQ 4), so they are
what a user who cares about delivery runs; and they differ from classic queues where
relier is exposed: every process must declare the recovery queue as a quorum queue too
(``publish.declare``), Celery drops global QoS for them, and a redelivered message
counts against a delivery limit. Classic queues are covered by
tests/integration/celery_compat/test_rabbitmq_broker.py.

The node is killed (``SIGKILL`` of its VM, as a crash or an OOM kill would) and started
again on the same ports and data; at full size a second, graceful, restart follows
(``rabbitmqctl stop``). Each comes right after a burst of pushes, so that the node
goes down holding messages: ready in the queue and delivered into the workers'
prefetch, unacknowledged.

No queued grace here (``RELIER_QUEUED_GRACE_S`` keeps its default, an hour): unlike
kombu's Redis transport, which pops a message before recording it as unacknowledged,
RabbitMQ keeps every delivered message until it is acknowledged, so no fault of this
run may leave a task that only the grace brings back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from testproject.rabbitmq import RabbitServer

from ..evidence import TASK_QUEUES, Evidence, rabbit_queued
from ..invariants import Check
from ..runner import Item, Run
from . import Scenario
from .common import faulted_run

QUEUE_TYPE = "quorum"
WORK_S = (0.4, 1.2)
# Each burst's tasks outlast the reading before the node fault (rabbitmqctl, under a
# second): the pool processes cannot have started all of them when the node goes down.
BURST_WORK_S = (1.0, 2.0)
PACE = 0.8  # the steady producer pushes at this share of what the workers can run
MIN_SPAN_S = 12.0  # the steady producer's least span: it still pushes when the node dies
# A publish must outlast the node's absence (a crash and ~3-4 s of start-up) rather
# than Celery's default 0.6 s of retries, as a producer expecting restarts configures it.
PUBLISH_RETRY = {"max_retries": 30, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 1}
NODE_FAULTS = ("crash", "restart")


def rabbitmq_setup(run: Run) -> dict[str, Any]:
    run.cluster.start_redis()
    node = run.cluster.start_rabbitmq()
    run.note(
        f"Celery's broker: a private RabbitMQ node ({node.node}, :{node.port}), "
        f"{QUEUE_TYPE} queues; relier's store on the private Redis"
    )
    return {"task_default_queue_type": QUEUE_TYPE, "task_publish_retry_policy": PUBLISH_RETRY}


def plan(n: int) -> list[str]:
    """The faults in order. Small: a pool process's kill, the zombie, the node crash, a
    whole worker's kill. Full (500): ten kills, alternating, with the zombie after the
    first, the crash halfway and the graceful restart at four fifths."""
    steps = [("child", "worker")[k % 2] for k in range(max(2, n // 50))]
    steps.insert(1, "zombie")
    for share, kind in zip((0.5, 0.8), NODE_FAULTS[: 1 if n < 100 else 2], strict=False):
        steps.insert(round(len(steps) * share), kind)
    return steps


def rabbitmq_delivery(run: Run) -> None:
    node = run.cluster.rabbit
    assert node is not None, "rabbitmq_setup starts the node"
    run.start()
    steps = plan(run.n)
    done = faulted_run(
        run, steps, NODE_FAULTS, max(8, run.n // 10), WORK_S, BURST_WORK_S, PACE, MIN_SPAN_S,
        lambda kind, burst: _node_fault(run, node, kind, burst),
    )  # fmt: skip
    done.verify(run, steps)
    run.verify(_node_checks(node, done.server, sum(1 for s in steps if s in NODE_FAULTS)))


def _node_fault(run: Run, node: RabbitServer, kind: str, burst: list[Item]) -> int:
    """Push ``burst``, then crash (SIGKILL) or stop (``rabbitmqctl stop``) the node and
    start it again on the same ports and data. Returns the messages it held just before
    (ready, or in the workers' prefetch and unacknowledged)."""
    run.push_all(burst)
    held = sum(rabbit_queued(node).values())
    pid = node.pid
    if kind == "crash":
        node.kill()
        run.fault(f"SIGKILL of the RabbitMQ node (beam.smp {pid}) holding {held} message(s)")
        node.start()
    else:
        run.fault(f"rabbitmqctl stop of the RabbitMQ node holding {held} message(s)")
        node.restart()
    run.fault(
        f"RabbitMQ node back on :{node.port} (beam.smp {node.pid}), same name and data",
        interrupts=False,
    )
    return held


def _node_checks(
    node: RabbitServer, held: list[int], planned: int
) -> Callable[[Evidence], list[Check]]:
    def verify(ev: Evidence) -> list[Check]:
        listed = node.ctl("list_queues", "name", "type", "--quiet", "--no-table-headers")
        types = dict(line.split("\t")[:2] for line in listed.splitlines() if "\t" in line)
        wanted = {queue: QUEUE_TYPE for queue in TASK_QUEUES}
        return [
            Check(
                "the RabbitMQ node went down mid-run holding messages, and came back",
                len(held) == planned and all(held) and node.alive(),
                f"{len(held)}/{planned} node fault(s), holding {held} message(s) (ready + "
                "unacknowledged, read just before)",
            ),
            Check(
                f"the task queue and the recovery queue are {QUEUE_TYPE} queues",
                {q: types.get(q) for q in TASK_QUEUES} == wanted,
                ", ".join(f"{q}: {types.get(q, 'missing')}" for q in TASK_QUEUES),
            ),
        ]

    return verify


RABBITMQ_DELIVERY = Scenario(
    "rabbitmq-delivery",
    "RabbitMQ as the broker (quorum queues): worker SIGKILLs, a zombie, a node crash",
    rabbitmq_delivery,
    env={"CELERY_TASK_DEFAULT_QUEUE_TYPE": QUEUE_TYPE},
    setup=rabbitmq_setup,
)
