"""relier_django's store on a Redis Cluster whose masters fail.

- A master SIGKILLed under load is failed over by the cluster itself (its replica takes
  its slots); nobody is told anything; every task pushed before, during and after the
  failover commits exactly once, and no live process is taken for dead.
- The same when the killed master is the "home" node, the master of the ``{g}`` slot
  (the scanner lease, the holders' set, and every liveness connection): the liveness
  connections come back on the new home master, and a pool process killed after the
  failover is still found dead by its connection; its task comes back and commits.
- On a healthy cluster, a pool process SIGKILLed mid-task: the scanners find it dead
  by its connection, and its task comes back at once (cause ``process_death``, or
  ``pool_death`` when Celery's main process hands it off first), once.

What this proves and what it does not, as in tests/chaos/test_sentinel.py: replication
is asynchronous, so a write a master acknowledged in its last instant may never reach
its replica, and is lost with it in a failover (docs/operations.md, "the replication
window"). Every kill here is made when the replicas hold every acknowledged write
(``ClusterGroup.kill_master_when_replicated``), so these tests prove that the
*failover* loses nothing and needs no manual step, and say nothing about that window.

The failover tests run on a cluster of their own (3 masters, a replica each), so the
session's cluster keeps its shape; the broker is the session's plain Redis. They report
every fault they find at once (``Problems``): a failover can break several things.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from relier_django import PushFailed, TaskFailed
from relier_django.core.model.config import current
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import partition_tags
from relier_django.core.store.liveness import worker_of
from relier_django.core.store.receipt import Receipt
from testproject import cluster as cluster_harness
from testproject.cluster import ClusterGroup
from testproject.demo import tasks
from testproject.harness import (
    CeleryWorker,
    RedisServer,
    process_pointed_at,
    wait_until,
)  # fmt: skip
from tests.cluster import stores
from tests.cluster.stores import PARTITIONS, keys
from tests.conftest import WorkerFactory
from tests.leaks import assert_no_leaked_keys

# A heartbeat TTL above the failover time (2-3 s here): a running task keeps its
# incarnation through the outage instead of being resurrected, as in test_sentinel.py.
WORKER_ENV = {
    "RELIER_HEARTBEAT_TTL_S": "8",
    "RELIER_SCAN_INTERVAL_S": "0.3",
    "RELIER_LEADER_LEASE_S": "2",
}
DEAD = "holder found dead (its connection is gone) worker="


# -- helpers and fixtures of this module --------------------------------------------------


def node_url(node: RedisServer) -> str:
    return f"redis://127.0.0.1:{node.port}"


def store_env(seed: str, broker: RedisServer) -> dict[str, str]:
    """:func:`stores.store_env` with this module's worker timings."""
    return stores.store_env(seed, broker, **WORKER_ENV)


StartWorker = Callable[[dict[str, str]], CeleryWorker]


@pytest.fixture
def start_worker(worker_factory: WorkerFactory) -> StartWorker:
    """Start real prefork workers (concurrency 2) with an environment from
    :func:`store_env` (the session's plain Redis as the broker); SIGKILLed at teardown."""
    return lambda env: worker_factory(extra_env=stores.relier_vars(env))


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[ClusterGroup]:
    """A private cluster for one test: 3 masters with a replica each, stopped by PID."""
    with cluster_harness.redis_cluster(tmp_path / "own-cluster", masters=3, replicas=1) as group:
        yield group


def home_of(group: ClusterGroup) -> RedisServer:
    """The master that serves the ``{g}`` slot: the liveness connections' server."""
    return group.node_of_key(keys().holders)


def partitions_of(group: ClusterGroup, master: RedisServer) -> set[int]:
    return {
        k for k, tag in enumerate(partition_tags(PARTITIONS))
        if group.node_of_key(f"{{{tag}}}") is master
    }  # fmt: skip


def id_in(partition: int) -> str:
    """A fresh task id that lives in ``partition``."""
    while True:
        candidate = uuid.uuid4().hex
        if keys().partition_of(candidate) == partition:
            return candidate


def runs(label: str) -> list[int]:
    """The fence of each run of a ``sync_record`` task (``fence:worker`` per run)."""
    found = sync_client(current()).lrange(f"demo:exec:{label}", 0, -1)
    return [int(str(entry).split(":")[0]) for entry in found]


def starts(label: str) -> list[tuple[int, int]]:
    """``(fence, pid)`` of each start of a ``work`` task (``fence:time:pid``)."""
    found = sync_client(current()).lrange(f"demo:start:{label}", 0, -1)
    return [(int(f), int(pid)) for f, _, pid in (str(e).split(":") for e in found)]


def listed_holders(group: ClusterGroup) -> set[str]:
    """The worker ids whose liveness connection the home master lists now, as the
    scanners read them (``recovery/deaths.py``)."""
    with home_of(group).client(decode_responses=True) as client:
        clients = client.client_list(_type="pubsub")
    prefix = keys().prefix
    return {w for c in clients if (w := worker_of(prefix, str(c.get("name", ""))))}


def process_ids(worker: CeleryWorker) -> set[str]:
    """The holder ids of a worker's processes: its main process and its pool."""
    return {f"{worker.hostname}:{pid}" for pid in (worker.pid, *(c.pid for c in worker.children()))}


def counters(client: RedisCluster) -> dict[str, int]:
    """The store's metrics counters, summed over the partitions' hashes (``<p>:m``),
    each read in its own slot."""
    total: dict[str, int] = {}
    for part in keys().parts():
        for name, value in client.hgetall(part.metrics_counters).items():
            total[str(name)] = total.get(str(name), 0) + int(value)
    return total


def resurrections(client: RedisCluster) -> dict[str, int]:
    """Resurrections by cause (the ``res:<cause>`` counters resurrected.lua keeps)."""
    return {name[4:]: n for name, n in counters(client).items() if name.startswith("res:")}


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}


class Problems(list[str]):
    """Faults found along a test, reported together at its end."""

    def check(self, ok: object, message: str) -> bool:
        if not ok:
            self.append(message)
        return bool(ok)

    def assert_none(self) -> None:
        assert not self, "\n".join(["faults found:", *(f"- {p}" for p in self)])


def push_during_failover(label: str, partition: int, problems: Problems) -> Receipt | None:
    """Push a task into ``partition`` while a master is down: the producer's store call
    must wait, within its client's retries, for the failover (as under Sentinel)."""
    started = time.monotonic()
    try:
        return tasks.sync_record.apply_async([label, 0.05], task_id=id_in(partition))
    except (PushFailed, redis.exceptions.RedisError) as exc:
        problems.append(
            f"push of {label} into partition {partition} raised after "
            f"{time.monotonic() - started:.2f}s, the master still down: {exc!r}"
        )
        return None


def outcomes(receipts: dict[str, Receipt], timeout_s: float, problems: Problems) -> dict:
    """Each receipt's result by label; a dead-lettered or unfinished task is a problem."""
    deadline = time.monotonic() + timeout_s
    results: dict[str, Any] = {}
    for label, receipt in receipts.items():
        try:
            results[label] = receipt.get(timeout=max(0.5, deadline - time.monotonic()))
        except TaskFailed as exc:
            problems.append(f"{label} (partition {keys().partition_of(receipt.task_id)}): {exc}")
        except TimeoutError as exc:
            problems.append(f"{label}: no result: {exc}")
    return results


def check_exactly_once(results: dict[str, Any], problems: Problems) -> int:
    """Each committed task committed one result, at the fence of its last run, and every
    run had a fence of its own (a task runs twice only if one of its calls outlasted
    the clients' retries). Returns how many ran twice."""
    twice = 0
    for label, result in results.items():
        fences = runs(label)
        problems.check(
            result["label"] == label and fences and fences[-1] == result["fence"],
            f"{label}: result {result} does not match its runs {fences}",
        )
        problems.check(len(set(fences)) == len(fences) <= 2, f"{label}: runs {fences}")
        twice += len(fences) > 1
    return twice


def nothing_in_flight(client: RedisCluster) -> bool:
    parts = keys().parts()
    try:
        wait_until(lambda: all(client.zcard(p.expiry) == 0 for p in parts), 10, what="")
    except TimeoutError:
        return False
    return True


# -- 1. a master that is not the home node ------------------------------------------------


def test_a_master_killed_under_load_fails_over_and_every_task_commits_once(
    own_cluster: ClusterGroup, redis_server: RedisServer, start_worker: StartWorker
) -> None:
    group, problems = own_cluster, Problems()
    masters = group.masters()
    with process_pointed_at(store_env(group.url, redis_server)):
        home = home_of(group)
    # The seed URL names the home master, which lives on: a process that starts after
    # the kill (a replacement pool process) still finds the cluster through it.
    env = store_env(node_url(home), redis_server)
    with process_pointed_at(env):
        worker = start_worker(env)
        client = sync_client(current())
        victim = next(m for m in masters if m is not home)
        served = partitions_of(group, victim)
        replica = group.replicas_of(victim)[0]
        assert len(served) == 2, served

        receipts = {f"load-{i}": tasks.sync_record.push(f"load-{i}", 0.15) for i in range(60)}
        space = keys()
        assert {space.partition_of(r.task_id) for r in receipts.values()} == set(range(PARTITIONS))
        # Mid-workload: some committed, two running, the rest queued or prefetched.
        wait_until(lambda: runs("load-5"), 30, what="the first tasks")
        assert len(worker.children()) == 2

        old = group.kill_master_when_replicated(victim)
        killed_at = time.monotonic()
        # Pushed while the cluster is still deciding, one into each partition: those
        # into the dead master's wait for the new one.
        for k in range(PARTITIONS):
            receipt = push_during_failover(f"during-{k}", k, problems)
            if receipt is not None:
                receipts[f"during-{k}"] = receipt
        new = group.wait_for_failover(old)
        failover_s = time.monotonic() - killed_at
        assert new is replica and partitions_of(group, new) == served
        for k in range(PARTITIONS):
            label = f"after-{k}"
            receipts[label] = tasks.sync_record.apply_async([label, 0.05], task_id=id_in(k))

        results = outcomes(receipts, 30, problems)
        drained_s = time.monotonic() - killed_at
        twice = check_exactly_once(results, problems)
        # One commit per task (the store counts a commit once per task), nothing
        # dead-lettered, nothing left in any partition's expiry index.
        found = counters(client)
        problems.check(
            found.get("pushed") == found.get("committed") == len(receipts),
            f"pushed {found.get('pushed')}, committed {found.get('committed')}, "
            f"{len(receipts)} receipts",
        )
        dlq = sum(client.zcard(p.dlq) for p in space.parts())
        problems.check(dlq == 0, f"{dlq} task(s) in the DLQ")
        if problems.check(nothing_in_flight(client), "tasks left in the expiry indexes"):
            assert_no_leaked_keys(client, space)
        # The home master lived: every liveness connection stayed open, and no live
        # process was taken for dead.
        problems.check(DEAD not in worker.log_text(), "a live process was found dead")
        resurrected = resurrections(client)
    print(
        f"failover took {failover_s:.1f}s, drained {drained_s:.1f}s after the kill; "
        f"tasks run twice: {twice} of {len(receipts)}; resurrections: {resurrected}"
    )
    problems.assert_none()
    assert failover_s < 15


# -- 2. the home master -------------------------------------------------------------------


@pytest.mark.parametrize("pool", ["busy", "idle", "restarted"])
def test_the_home_master_killed_fails_over_and_a_dead_pool_process_is_still_found(
    pool: str, own_cluster: ClusterGroup, redis_server: RedisServer, start_worker: StartWorker
) -> None:
    """``busy``: killed under load, as the first test. ``idle``: killed once the load
    has drained, so the pool processes make no call to the store while the cluster
    fails over (most of a large pool, at any instant). ``restarted``: idle, and the old
    master is back at once, a replica at the address every liveness connection
    reconnects to (the chaos runner's cluster-delivery found live processes declared
    dead so)."""
    group, problems = own_cluster, Problems()
    with process_pointed_at(store_env(group.url, redis_server)):
        home = home_of(group)
    # The seed URL names a master that lives on (see the first test).
    seed = next(m for m in group.masters() if m is not home)
    env = store_env(node_url(seed), redis_server)
    with process_pointed_at(env):
        worker = start_worker(env)
        client = sync_client(current())
        wait_until(
            lambda: process_ids(worker) <= listed_holders(group), 10,
            what="every process of the worker to hold its liveness connection",
        )  # fmt: skip
        assert partitions_of(group, home), "the home master serves partitions too"

        receipts = {f"load-{i}": tasks.sync_record.push(f"load-{i}", 0.15) for i in range(24)}
        if pool == "busy":
            wait_until(lambda: runs("load-3"), 30, what="the first tasks")
        else:
            check_exactly_once(outcomes(receipts, 30, problems), problems)
        old = group.kill_master_when_replicated(home)
        killed_at = time.monotonic()
        new = group.wait_for_failover(old)
        failover_s = time.monotonic() - killed_at
        assert home_of(group) is new  # the {g} slot moved with the rest of the slots
        if pool == "restarted":
            group.restart(old)
        if pool == "busy":
            check_exactly_once(outcomes(receipts, 30, problems), problems)

        # Every process of the worker (its main process, whose scanner holds the
        # connection it names, and each pool process) names its connection again, on
        # the new home master, and none of them is taken for dead meanwhile.
        expected = process_ids(worker)
        try:  # a reconnect takes the clients' retries (at most 7.5 s), then a check
            wait_until(
                lambda: expected <= listed_holders(group),
                max(1.0, killed_at + 15 - time.monotonic()), what="",
            )  # fmt: skip
        except TimeoutError:
            problems.append(
                f"{time.monotonic() - killed_at:.1f}s after the kill, the new home master "
                f"{new.port} lists the liveness connections of {sorted(listed_holders(group))}; "
                f"the worker's processes are {sorted(expected)}"
            )
        back_s = time.monotonic() - killed_at
        problems.check(
            DEAD not in worker.log_text(),
            "live processes found dead: "
            f"{[line for line in worker.log_text().splitlines() if DEAD in line]}",
        )

        # A pool process killed now, mid-task: its task comes back and commits.
        before_kill = resurrections(client)
        receipt = tasks.work.push("after-home-failover", 3.0)
        first = wait_until(lambda: starts("after-home-failover"), 15, what="the task to start")
        pid = first[0][1]
        assert first[0][0] == 1 and pid in {c.pid for c in worker.children()}
        log_before_kill = len(worker.log_text())
        worker.kill_child(pid)
        killed_child_at = time.monotonic()
        second = wait_until(
            lambda: starts("after-home-failover")[1:], 20, what="the task's second incarnation"
        )  # fmt: skip
        recovered_s = time.monotonic() - killed_child_at
        # Read while the second incarnation runs: the task hash is deleted by its commit.
        cause = client.hget(keys().task(receipt.task_id), "res_cause")
        receipt.get(timeout=15)
        assert second[0][0] == 2
        assert client.lrange("demo:exec:after-home-failover", 0, -1) == ["2"]
        # Handed off once, by the main process or the scanner (see the next test) ...
        counted = delta(before_kill, resurrections(client))
        assert cause in ("pool_death", "process_death"), (cause, counted)
        assert counted == {cause: 1}, counted
        # ... and found dead by its connection, which it held on the new home master.
        verdict = f"{DEAD}{worker.hostname}:{pid}"
        try:
            wait_until(lambda: verdict in worker.log_text()[log_before_kill:], 5)
        except TimeoutError:
            problems.append(f"the killed pool process {pid} was never found dead by connection")
        problems.check(nothing_in_flight(client), "tasks left in the expiry indexes")
    print(
        f"home failover took {failover_s:.1f}s; liveness back {back_s:.1f}s after the kill; "
        f"the killed pool process's task back in {recovered_s:.1f}s"
    )
    problems.assert_none()


# -- 3. a healthy cluster -----------------------------------------------------------------


@pytest.fixture
def on_session_cluster(
    redis_cluster: ClusterGroup,
    cluster_client: RedisCluster,
    redis_server: RedisServer,
    redis_client: redis.Redis,
) -> Iterator[dict[str, str]]:
    """This process with the store on the session's cluster (flushed by
    ``cluster_client``) and the broker on the session's plain Redis (flushed)."""
    env = store_env(redis_cluster.url, redis_server)
    with process_pointed_at(env):
        yield env


def test_a_killed_pool_process_is_found_dead_and_its_task_comes_back(
    on_session_cluster: dict[str, str], start_worker: StartWorker
) -> None:
    worker = start_worker(on_session_cluster)
    client = sync_client(current())
    before = resurrections(client)
    receipt = tasks.work.push("pool-kill", 3.0)
    first = wait_until(lambda: starts("pool-kill"), 15, what="the task to start")
    pid = first[0][1]
    assert first[0][0] == 1 and pid in {c.pid for c in worker.children()}
    worker.kill_child(pid)
    killed_at = time.monotonic()
    second = wait_until(lambda: starts("pool-kill")[1:], 15, what="the second incarnation")
    recovered_s = time.monotonic() - killed_at
    # Read while the second incarnation runs: the task hash is deleted by its commit.
    cause = client.hget(keys().task(receipt.task_id), "res_cause")
    receipt.get(timeout=15)

    assert second[0][0] == 2
    assert client.lrange("demo:exec:pool-kill", 0, -1) == ["2"]
    # Two detectors race, and either hands the task off first; the other then finds
    # it moved on and leaves it alone, so it comes back once: Celery's main process
    # (WorkerLostError: 'pool_death', worker/signals.py), and the scanner, which lists
    # the liveness connections every 0.25 s and finds the process's gone for its
    # grace (1 s) ('process_death', orphans.lua). Not the heartbeat TTL (8 s).
    assert cause in ("pool_death", "process_death")
    assert delta(before, resurrections(client)) == {cause: 1}
    # Whichever won, the scanner found the process dead by its connection.
    wait_until(
        lambda: f"{DEAD}{worker.hostname}:{pid}" in worker.log_text(), 5,
        what="the connection check's verdict on the killed process",
    )  # fmt: skip
    print(f"the killed pool process's task came back {recovered_s:.1f}s after the kill ({cause})")


# -- the cause of what the failover tests find --------------------------------------------


def test_a_store_call_into_a_killed_masters_slots_waits_for_the_failover(
    own_cluster: ClusterGroup, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """connection.py: "A restart, a failover or a brief network cut must not fail a
    task's start or commit: connection errors are retried with backoff for at least
    3.75 s" (longer than a failover here: 2-3 s). A push into a partition of a master
    killed a moment ago must wait for its replica to take over, and be stored."""
    group = own_cluster
    with process_pointed_at(store_env(group.url, redis_server)):
        home = home_of(group)
    env = store_env(node_url(home), redis_server)
    with process_pointed_at(env):
        client = sync_client(current())
        victim = next(m for m in group.masters() if m is not home)
        partition = min(partitions_of(group, victim))
        client.ping()  # the client knows the cluster before the kill
        old = group.kill_master_when_replicated(victim)
        killed_at = time.monotonic()
        try:
            receipt = tasks.sync_record.apply_async(["one", 0.0], task_id=id_in(partition))
        except (PushFailed, redis.exceptions.RedisError) as exc:
            raise AssertionError(
                f"the push raised {time.monotonic() - killed_at:.2f}s after the kill, "
                "before the failover"
            ) from exc
        pushed_s = time.monotonic() - killed_at
        new = group.wait_for_failover(old)
        assert client.hget(keys().task(receipt.task_id), "state") == "queued"
        assert group.node_of_key(keys().task(receipt.task_id)) is new
    print(f"the push waited {pushed_s:.2f}s for the failover")
