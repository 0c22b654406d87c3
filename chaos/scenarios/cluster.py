"""relier's store on a Redis Cluster, Celery's broker on a plain Redis: pool-process and
whole-worker SIGKILLs, a zombie pool process and master failovers, in one run.

The store is a private cluster of 3 masters with a replica each (``testproject/cluster.py``,
``cluster-node-timeout`` 1 s), split into 6 partitions (two per master); every process
reaches it through one seed URL, the "home" master's (the ``{g}`` slot: liveness
connections, the scanner lease, worker presence). Celery's broker is the run's private
plain Redis: kombu's transport cannot use a cluster.

A failover: a burst of longer tasks is pushed, so that the victim's partitions hold
tasks queued, prefetched and running; the victim is SIGKILLed at an instant when its
replica holds every write it acknowledged (``ClusterGroup.kill_master_when_replicated``:
the failover is what is tested, not the replication window); nobody is told; the
cluster promotes the replica; the old master is then started again on its data and
rejoins as the new master's replica. Small: one failover, of a master other than the
home one. Full: a second one, of the home master, at four fifths.

The queued grace is shortened as in worker-kill: the broker is kombu's Redis transport,
whose pop-then-record window a whole-worker SIGKILL can hit.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relier_django.core.store.keys import partition_tags
from testproject.cluster import ClusterGroup
from testproject.harness import RedisServer

from .. import evidence
from ..evidence import Evidence
from ..invariants import Check
from ..runner import Item, Run
from . import Scenario
from .common import faulted_run

MASTERS, REPLICAS, PARTITIONS = 3, 1, 6
HOME = "{g}"  # a key of the home slot: the same slot whatever the prefix
WORK_S = (0.4, 1.2)
# A burst's tasks outlast the reads before the kill: the victim's partitions hold
# running tasks when it dies, not only queued ones.
BURST_WORK_S = (1.0, 2.0)
PACE = 0.8  # the steady producer pushes at this share of what the workers can run
MIN_SPAN_S = 12.0  # the steady producer's least span: it still pushes through the failover
# A scanner's step that raised: "<LEVEL> relier_django.resurrector <step> failed scanner=..."
# (WARNING when the store was away, ERROR otherwise).
_FAILED_STEP = re.compile(r"(?:WARNING|ERROR) relier_django\.\w+ (.+?) failed scanner=")


class _Clients:
    """The runner's clients of this run's servers, closed with the cluster."""

    def __init__(self, store: Any, broker: Any) -> None:
        self.store, self.broker = store, broker

    def stop(self) -> None:
        self.store.close()
        self.broker.close()


def cluster_setup(run: Run) -> dict[str, Any]:
    broker = run.cluster.start_redis()
    group = run.cluster.start_redis_cluster(PARTITIONS, MASTERS, REPLICAS)
    clients = _Clients(group.client(decode_responses=True), broker.client(decode_responses=True))
    run.cluster.adopt(clients)
    # The store's reads (outcomes, task states, the evidence) go to the cluster; what the
    # broker holds is read on the plain Redis.
    run.client_factory = lambda: clients.store
    run.queued = lambda: evidence.queued(clients.broker)  # type: ignore[method-assign]
    home = group.node_of_key(HOME)
    masters = ", ".join(
        f":{m.port} (partitions {_listed(_partitions_of(group, m))}"
        + (", home" if m is home else "")
        + ")"
        for m in group.masters()
    )
    run.note(
        f"relier's store: a private Redis Cluster, {MASTERS} masters with {REPLICAS} replica "
        f"each, PARTITIONS={PARTITIONS}: {masters}; seed URL :{home.port}. Celery's broker: "
        f"the private plain Redis :{broker.port}"
    )
    return {}


def _partitions_of(group: ClusterGroup, master: RedisServer) -> set[int]:
    return {
        k
        for k, tag in enumerate(partition_tags(PARTITIONS))
        if group.node_of_key(f"{{{tag}}}") is master
    }


def _listed(partitions: set[int]) -> str:
    return ", ".join(str(k) for k in sorted(partitions)) or "none"


def plan(n: int) -> list[str]:
    """The faults in order. Small: a pool process's kill, the zombie, the failover, a
    whole worker's kill. Full (500): ten kills, alternating, with the zombie after the
    first, a failover halfway and the home master's at four fifths."""
    steps = [("child", "worker")[k % 2] for k in range(max(2, n // 50))]
    steps.insert(1, "zombie")
    for share in (0.5, 0.8)[: 1 if n < 100 else 2]:
        steps.insert(round(len(steps) * share), "failover")
    return steps


@dataclass(frozen=True)
class Failover:
    port: int  # the old master's
    partitions: frozenset[int]
    home: bool
    in_flight: int  # its partitions' expiry indexes, read just before the kill
    replica: RedisServer  # its replica, read before the kill
    new: RedisServer
    taken: frozenset[int]  # the partitions the new master serves, read once promoted
    took_s: float
    old: RedisServer


def cluster_delivery(run: Run) -> None:
    group = run.cluster.store_cluster
    assert group is not None, "cluster_setup starts the cluster"
    home = group.node_of_key(HOME)
    others = [m for m in group.masters() if m is not home]
    run.rng.shuffle(others)
    run.start()
    steps = plan(run.n)
    victims = [others[0], home][: steps.count("failover")]
    targets = iter(victims)
    done = faulted_run(
        run, steps, ("failover",), max(6, run.n // 10), WORK_S, BURST_WORK_S, PACE, MIN_SPAN_S,
        lambda _, items: _failover(run, group, next(targets), items),
    )  # fmt: skip
    failovers: list[Failover] = done.server
    done.verify(run, steps)
    run.verify(_failover_checks(group, failovers, len(victims)))
    run.verify(_log_checks(run))


def _failover(run: Run, group: ClusterGroup, victim: RedisServer, burst: list[Item]) -> Failover:
    """Push ``burst``, then SIGKILL ``victim`` (a master) at a fully replicated instant,
    wait for its replica to take its slots, and start it again on its data: it rejoins
    as that replica's replica."""
    run.push_all(burst)
    space = evidence.keys()
    served = _partitions_of(group, victim)
    is_home = victim is group.node_of_key(HOME)
    (replica,) = group.replicas_of(victim)
    in_flight = sum(int(run.client.zcard(space.at(k).expiry)) for k in served)
    pid = victim.pid
    old = group.kill_master_when_replicated(victim)
    killed = time.monotonic()
    run.fault(
        f"SIGKILL of master redis-server :{old.port} ({pid}) serving partitions "
        f"{_listed(served)}" + (" and the home slot {g}" if is_home else "")
        + f", {in_flight} task(s) in flight there (at a fully replicated instant)"
    )  # fmt: skip
    new = group.wait_for_failover(old, timeout_s=60)
    took = time.monotonic() - killed
    taken = frozenset(_partitions_of(group, new) & served)
    run.fault(
        f"the cluster promoted :{new.port} after {took:.1f} s; nobody was told",
        interrupts=False,
    )
    group.restart(old, timeout_s=60)
    run.fault(
        f"redis-server :{old.port} started again on its data ({old.pid}): it rejoined",
        interrupts=False,
    )
    return Failover(old.port, frozenset(served), is_home, in_flight, replica, new, taken, took, old)


def _failover_checks(
    group: ClusterGroup, done: list[Failover], planned: int
) -> Callable[[Evidence], list[Check]]:
    def verify(ev: Evidence) -> list[Check]:
        # The topology now, read live: no old master serves slots any more.
        masters = group.masters()
        rejoined = [f for f in done if group.alive(f.old) and f.old not in masters]
        whole = group.settled()
        moved = [f for f in done if f.new is f.replica and f.taken == f.partitions]
        each = "; ".join(
            f":{f.port} -> :{f.new.port} in {f.took_s:.1f} s, partitions "
            f"{_listed(set(f.partitions))}{' + home' if f.home else ''}, {f.in_flight} in flight"
            for f in done
        )
        return [
            Check(
                "each failed-over master held tasks in flight, and its replica took its slots",
                len(done) == planned and all(f.in_flight for f in done) and len(moved) == len(done),
                f"{len(done)}/{planned} failover(s): {each}",
            ),
            Check(
                "each old master rejoined as a replica; the cluster is whole at the end",
                len(rejoined) == len(done) and whole,
                f"{len(rejoined)}/{len(done)} rejoined as replicas; all 16384 slots served, "
                f"every node agreeing: {whole}",
            ),
        ]

    return verify


def _log_checks(run: Run) -> Callable[[Evidence], list[Check]]:
    """No process ever sent a command over several slots: a cluster refuses it
    (``CROSSSLOT``), which would mean a script whose keys are not all in one partition.
    Two signs of how a failover reached the processes are noted, not checked: scanners
    that gave up listing liveness connections, and scanner steps that failed."""
    paths = [*run.cluster.log_paths(), run.run_dir / "runner.log"]

    def verify(ev: Evidence) -> list[Check]:
        found, gave_up, failed = [], [], Counter[str]()
        for path in paths:
            for line in _lines(path) if path.exists() else []:
                if "CROSSSLOT" in line:
                    found.append(f"{path.name}: {line.strip()[:160]}")
                elif "CLIENT LIST is refused" in line:
                    gave_up.append(f"{path.name}: {line.strip()[:200]}")
                elif (step := _FAILED_STEP.search(line)) is not None:
                    failed[step.group(1)] += 1
        if gave_up:
            run.note(
                f"{len(gave_up)} scanner(s) turned their death check (liveness connections) "
                "off: a dead process is then found by its TTL alone when that scanner leads: "
                f"{gave_up[0]}"
            )
        if failed:
            run.note(
                "scanner steps that failed during the outage (retried at the next tick): "
                + ", ".join(f"{step} x{n}" for step, n in sorted(failed.items()))
            )
        return [
            Check(
                "no CROSSSLOT refusal in any process's log",
                not found,
                f"{len(found)}" + (f": {found[0]}" if found else ""),
            )
        ]

    return verify


def _lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines()


CLUSTER_DELIVERY = Scenario(
    "cluster-delivery",
    "the store on a Redis Cluster: worker SIGKILLs, a zombie, a master failover",
    cluster_delivery,
    env=lambda opts: {
        "RELIER_CLUSTER": "true",
        "RELIER_PARTITIONS": str(PARTITIONS),
        # The queued grace at its default (an hour): the workers take from the broker
        # (the run's plain Redis) with take_inflight.lua, and the scanner puts back what
        # a dead one took (docs/architecture.md, a pop that leaves a trace).
    },
    setup=cluster_setup,
)
