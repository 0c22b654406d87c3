"""relier_django with its store on a private Redis Cluster (3 masters, a replica each):
the core (push, run, commit, idempotency, retries, countdown), delivery (a killed
pool process and a killed worker lose nothing), the DLQ and the metrics, with the
broker on a plain Redis of its own (kombu's transport does not support a cluster).

Every script call here runs on a real cluster, which refuses any call whose keys lie
in more than one slot (CROSSSLOT): a key outside its partition fails these tests.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator

import pytest
import redis
from celery import chain, chord, group
from redis.cluster import RedisCluster
from redis.crc import key_slot

import relier_django
from relier_django import AdmissionRejected, TaskFailed, dlq
from relier_django.core.dlq.store import DeadLetterStore
from relier_django.core.model.config import current
from relier_django.core.model.idem_key import derive_key
from relier_django.core.model.rates import Rate
from relier_django.core.observe import measurements
from relier_django.core.observe.audit import audit
from relier_django.core.push import admission
from relier_django.core.store.connection import close_loop_clients, sync_client
from relier_django.core.store.keys import KeySpace, partition_tags
from relier_django.dlq import release_entry
from testproject.cluster import ClusterGroup
from testproject.demo import jobs as djobs
from testproject.demo import tasks
from testproject.harness import CeleryWorker, RedisServer, process_pointed_at, wait_until
from tests.cluster.stores import PARTITIONS, keys, relier_vars, store_env
from tests.conftest import WorkerFactory
from tests.integration.workflows.test_chord import relier_backend  # noqa: F401 (a fixture)
from tests.leaks import assert_no_leaked_keys


@pytest.fixture
def on_cluster(
    redis_cluster: ClusterGroup,
    cluster_client: RedisCluster,
    redis_server: RedisServer,
    redis_client: redis.Redis,
) -> Iterator[dict[str, str]]:
    """This process (and the workers given the returned environment) with the store on
    the session's cluster and the broker on the session's plain Redis, both flushed."""
    env = store_env(redis_cluster.url, redis_server)
    with process_pointed_at(env):
        yield env


@pytest.fixture
def cluster_worker(on_cluster: dict[str, str], worker_factory: WorkerFactory) -> CeleryWorker:
    return worker_factory(extra_env=relier_vars(on_cluster))


def test_partitions_spread_evenly_over_the_masters(redis_cluster: ClusterGroup) -> None:
    # Two partitions on each master: their tags' slots fall in each master's range.
    owners = Counter(
        redis_cluster.master_of_slot(key_slot(tag.encode())).port
        for tag in partition_tags(PARTITIONS)
    )
    assert sorted(owners.values()) == [2, 2, 2]


def _id_in(space: KeySpace, partition: int) -> str:
    """A fresh task id in ``partition``."""
    return space.new_id(near=space.at(partition).expiry)


def runs(label: str) -> list[str]:
    """The runs of a demo task that records itself (fence:worker per run)."""
    return [str(r) for r in sync_client(current()).lrange(f"demo:exec:{label}", 0, -1)]


def test_push_runs_and_commits_on_the_cluster(
    on_cluster: dict[str, str], cluster_worker: CeleryWorker, cluster_client: RedisCluster
) -> None:
    # Four tasks in each partition (ids drawn there), so every master runs scripts.
    space = keys()
    ids = [_id_in(space, k) for k in range(PARTITIONS) for _ in range(4)]
    receipts = [
        tasks.sync_record.apply_async([f"r{i}"], task_id=task_id) for i, task_id in enumerate(ids)
    ]
    for receipt in receipts:
        receipt.get(timeout=30)
    assert all(len(runs(f"r{i}")) == 1 for i in range(len(ids)))
    for part in space.parts():
        assert cluster_client.zcard(part.expiry) == 0
    assert_no_leaked_keys(cluster_client, space)
    # The delivery ledger, noted in each partition's slot and read over the masters.
    found = audit(cluster_client, space, 0, slack_ms=3000)
    assert (found.noted, found.classes, found.unexplained) == (len(ids), {"committed": len(ids)}, 0)


def test_an_idempotent_push_is_stored_once(
    on_cluster: dict[str, str], cluster_worker: CeleryWorker
) -> None:
    first = tasks.charge.push("order-1", 5)
    again = tasks.charge.push("order-1", 5)
    assert again.deduplicated and again.task_id == first.task_id
    assert first.get(timeout=30) == again.get(timeout=30)
    assert len(runs("charge:order-1")) == 1


def test_an_explicit_id_outside_its_claims_partition_is_refused(
    on_cluster: dict[str, str],
) -> None:
    space = keys()
    claim = space.idempotency("demo.charge", derive_key(None, ["order-2", 5], {}))
    wrong = next(
        f"id-{n}" for n in range(100)
        if space.partition_of(f"id-{n}") != space.partition_of_key(claim)
    )  # fmt: skip
    with pytest.raises(ValueError, match="different partitions"):
        tasks.charge.apply_async(["order-2", 5], task_id=wrong)


def test_retries_then_the_dlq_then_a_release(
    on_cluster: dict[str, str], cluster_worker: CeleryWorker, cluster_client: RedisCluster
) -> None:
    assert tasks.flaky.push("f1", 2).get(timeout=30)["fence"] == 3
    failing = [tasks.flaky.push(f"f-dead-{i}", 99) for i in range(6)]
    for receipt in failing:
        with pytest.raises(TaskFailed) as err:
            receipt.get(timeout=30)
        assert err.value.reason == "retries_exhausted"
    store = DeadLetterStore(sync_client(current()), keys())
    # Entries in several partitions, all listed, counted and paged as one queue.
    assert len({keys().partition_of(r.task_id) for r in failing}) > 1
    assert store.size() == 6
    assert store.counts().by_reason == {"retries_exhausted": 6}
    first = store.page(limit=4)
    rest = store.page(cursor=first.next_cursor, limit=4)
    listed = [e.id for e in (*first.entries, *rest.entries)]
    assert sorted(listed) == sorted(r.task_id for r in failing)
    # A release re-creates the task in its partition; it fails again (99 failures).
    released = release_entry(failing[0].task_id)
    with pytest.raises(TaskFailed):
        released.get(timeout=30)
    store.delete([r.task_id for r in failing])
    assert store.size() == 0


def test_a_killed_pool_process_and_worker_lose_nothing(
    on_cluster: dict[str, str], cluster_worker: CeleryWorker, worker_factory: WorkerFactory
) -> None:
    receipts = [tasks.work.push(f"k{i}", 0.4) for i in range(12)]
    wait_until(lambda: bool(cluster_worker.children()), 10, what="pool processes")
    time.sleep(0.6)
    cluster_worker.kill_child()
    time.sleep(0.5)
    cluster_worker.kill()  # the whole worker: its reserved messages too
    worker_factory(name="w2", extra_env=relier_vars(on_cluster))
    for receipt in receipts:
        receipt.get(timeout=60)
    # Every task committed (get() returned); the killed runs came back with a new fence.
    store = sync_client(current())
    fences = [int(f) for i in range(12) for f in store.lrange(f"demo:exec:k{i}", 0, -1)]
    assert len(fences) >= 12 and max(fences) >= 2


def test_metrics_add_up_over_every_partition(
    on_cluster: dict[str, str], cluster_worker: CeleryWorker
) -> None:
    for receipt in [tasks.sync_record.push(f"m{i}") for i in range(12)]:
        receipt.get(timeout=30)
    with pytest.raises(TaskFailed):
        tasks.explode.push("m-dead").get(timeout=30)
    f = measurements.read(sync_client(current()), current())
    assert f.counters["pushed"] == 13
    assert f.counters["committed"] == 12
    assert f.dlq_entries == 1


def test_a_countdown_is_dispatched_when_due(
    on_cluster: dict[str, str], cluster_worker: CeleryWorker
) -> None:
    started = time.monotonic()
    receipts = [tasks.sync_record.push_with(countdown=1.0).push(f"c{i}") for i in range(6)]
    for receipt in receipts:
        receipt.get(timeout=30)
    assert time.monotonic() - started >= 1.0


def test_admission_control_holds_on_the_cluster(on_cluster: dict[str, str]) -> None:
    # demo.limited: 3 a minute. Its counters share a slot of their own ({adm}), checked
    # by admit.lua before the store; a refused push stores nothing.
    admitted = [tasks.limited.push(f"a{i}") for i in range(3)]
    with pytest.raises(AdmissionRejected) as refused:
        tasks.limited.push("a3")
    assert refused.value.retry_after_s > 0
    client = sync_client(current())
    assert all(client.exists(keys().task(r.task_id)) for r in admitted)
    stored = sum(client.zcard(part.expiry) for part in keys().parts())
    assert stored == 3


def test_the_standalone_admission_check_counts_on_the_cluster(on_cluster: dict[str, str]) -> None:
    cfg = current()
    limits = admission.limits(keys(), cfg, "demo.any", Rate.parse("2/m"))

    async def three() -> list[bool]:
        try:
            return [(await admission.acheck(limits, cfg)).admitted for _ in range(3)]
        finally:
            await close_loop_clients()

    assert asyncio.run(three()) == [True, True, False]


def test_a_group_runs_each_member_once(
    on_cluster: dict[str, str], cluster_worker: CeleryWorker, cluster_client: RedisCluster
) -> None:
    add = tasks.step_add
    cluster_client.set("demo:broken:99", 1)
    result = group([add.s(i, 10) for i in range(6)] + [add.s(0, 99)]).apply_async()
    ids = [r.id for r in result.results]
    assert len({keys().partition_of(i) for i in ids}) > 1  # members in several partitions
    assert [relier_django.result(i).get(timeout=30) for i in ids[:6]] == list(range(10, 16))
    entry = wait_until(lambda: dlq.store().get(ids[6]), 30, what="the broken member")
    assert entry.envelope["workflow"] == result.id
    view = relier_django.workflow(result.id)
    assert view is not None and view.kind == "group"
    assert [s.task_id for s in view.steps] == ids


def test_a_chain_and_its_links_across_every_master_run_each_step_once(
    on_cluster: dict[str, str], cluster_worker: CeleryWorker, cluster_client: RedisCluster
) -> None:
    # Each step's commit hands its successor over to the successor's partition
    # (store/handover.py): a key of another slot in any script would be CROSSSLOT here.
    space, add = keys(), tasks.step_add
    ids = [_id_in(space, k) for k in (0, 2, 4, 1)]  # a partition on each master, and back
    link_id = _id_in(space, 5)
    steps = [add.s(1, 1).set(task_id=ids[0])]
    steps += [add.s(10**k).set(task_id=ids[k]) for k in range(1, 4)]
    chain(*steps).apply_async()
    parent = add.apply_async((1, 2), task_id=_id_in(space, 3),
                             link=add.s(1000).set(task_id=link_id))  # fmt: skip
    assert relier_django.result(ids[-1]).get(timeout=60) == 1112
    assert relier_django.result(link_id).get(timeout=30) == 1003
    assert all(len(runs(f"step:{i}")) == 1 for i in [*ids, parent.id, link_id])
    handed = [space.handed(i) for i in [*ids[1:], link_id]]
    assert [sync_client(current()).get(k) for k in handed] == [*ids[:-1], parent.id]
    # An errback (link_error=) of a task filed in the DLQ, handed over the same way.
    cluster_client.set("demo:broken:98", 1)
    errback = _id_in(space, 4)
    failed = add.apply_async((1, 98), task_id=_id_in(space, 1),
                             link_error=tasks.sync_record.s().set(task_id=errback))  # fmt: skip
    assert relier_django.result(errback).get(timeout=30)["label"] == failed.id
    assert sync_client(current()).get(space.handed(errback)) == f"{failed.id}:dead:1"
    assert not any(cluster_client.exists(p.handovers) for p in space.parts())


@pytest.mark.usefixtures("relier_backend")
def test_a_chord_across_every_master_runs_its_callback_once_with_every_result(
    on_cluster: dict[str, str], cluster_worker: CeleryWorker
) -> None:
    # Each member's result handed over to the chord's partition (chord_member.lua),
    # the callback to its own: a key of another slot would be CROSSSLOT here.
    space, add = keys(), tasks.step_add
    header = [add.s(k, 100).set(task_id=_id_in(space, k)) for k in range(PARTITIONS)]
    callback = tasks.step_sum.s(1000).set(task_id=_id_in(space, 0))
    result = chord(header)(callback)
    assert result.get(timeout=60) == 1000 + sum(range(100, 100 + PARTITIONS))
    assert all(len(runs(f"step:{i}")) == 1 for i in [*(m.id for m in header), result.id])


def test_cancel_takes_back_a_scheduled_idempotent_task(
    on_cluster: dict[str, str], cluster_worker: CeleryWorker, cluster_client: RedisCluster
) -> None:
    receipt = tasks.charge.push_with(countdown=1.5).push("o-cancel", 5)
    assert relier_django.cancel(receipt.task_id) is relier_django.Cancelled.BEFORE_START
    with pytest.raises(relier_django.TaskCancelled):
        receipt.get(timeout=5)
    assert cluster_client.zscore(keys().of_task(receipt.task_id).schedule, receipt.task_id) is None
    # The claim, in the task's partition, is freed: the same charge runs when pushed again.
    assert tasks.charge.push("o-cancel", 5).get(timeout=30)["order_id"] == "o-cancel"
    assert runs("charge:o-cancel") and len(runs("charge:o-cancel")) == 1


def test_django_tasks_enqueue_runs_and_reads_back_its_trail(
    on_cluster: dict[str, str], cluster_worker: CeleryWorker
) -> None:
    # The django.tasks backend keeps each result's trail (task hash and history, renamed
    # by commit.lua): its keys, in the task's partition, are read back by id.
    results = [djobs.add.enqueue(i, 3) for i in range(6)]
    assert len({keys().partition_of(r.id) for r in results}) > 1
    for result in results:
        wait_until(lambda r=result: r.refresh() or r.is_finished, 30, what="the result")
        assert result.return_value == int(result.args[0]) + 3
        assert result.attempts == 1 and result.worker_ids
        assert djobs.add.get_result(result.id).return_value == result.return_value
