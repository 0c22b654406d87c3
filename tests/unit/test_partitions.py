"""The partitioned key layout (docs/scaling.md#redis-cluster), as pure rules: every key
one script touches hashes to one Redis Cluster slot, partitions spread evenly over a
cluster's masters, and the plain layout is exactly what it always was.

The real cluster's verdict (it refuses a call whose keys lie in two slots) is in
tests/cluster; these rules are what makes it pass, checked over many ids.
"""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from relier_django.core.model.config import Config
from relier_django.core.model.errors import ConfigError
from relier_django.core.model.spec import TaskSpec
from relier_django.core.model.timing import Debounce
from relier_django.core.push import producer
from relier_django.core.store.keys import KeySpace, partition_tags


def _slots(keys: list[str]) -> set[int]:
    return {key_slot(k.encode()) for k in keys}


@pytest.mark.parametrize("partitions", [1, 3, 6, 16, 48, 1024])
def test_each_partitions_tag_falls_in_its_own_equal_share_of_the_slots(partitions: int) -> None:
    tags = partition_tags(partitions)
    assert len(set(tags)) == partitions
    for k, tag in enumerate(tags):
        low = k * REDIS_CLUSTER_HASH_SLOTS // partitions
        assert low <= key_slot(tag.encode()) < (k + 1) * REDIS_CLUSTER_HASH_SLOTS // partitions


@pytest.mark.parametrize(("masters", "partitions"), [(3, 6), (3, 48), (6, 48), (5, 48)])
def test_partitions_spread_over_the_ranges_redis_cli_gives_masters(
    masters: int, partitions: int
) -> None:
    # redis-cli --cluster create gives master m the m-th of equal contiguous ranges.
    def master_of(slot: int) -> int:
        return min(slot * masters // REDIS_CLUSTER_HASH_SLOTS, masters - 1)

    owners = Counter(master_of(key_slot(t.encode())) for t in partition_tags(partitions))
    assert len(owners) == masters
    assert max(owners.values()) - min(owners.values()) <= 1


def test_the_plain_layout_is_unchanged() -> None:
    keys = KeySpace("rl")
    assert not keys.tagged and keys.parts() == [keys] and keys.of_task("x") is keys
    assert keys.task("x") == "rl:t:{x}" and keys.expiry == "rl:expiry"
    assert keys.dlq_entry("x") == "rl:dlq:e:{x}" and keys.leader == "rl:resurrector:leader"
    assert keys.for_start("x") == ["rl:t:{x}", "rl:h:{x}", "rl:expiry", "rl:m", "rl:m:w"]
    assert KeySpace("rl", metrics=False).for_start("x")[-2:] == ["", ""]
    assert keys.admission_all == "rl:adm:all"


def _tagged(partitions: int = 6, metrics: bool = True) -> KeySpace:
    return KeySpace.of(Config(partitions=partitions, metrics=metrics))


@pytest.mark.parametrize("metrics", [True, False])
def test_every_scripts_keys_share_one_slot(metrics: bool) -> None:
    keys = _tagged(metrics=metrics)
    for _ in range(200):
        task_id = uuid.uuid4().hex
        claim = keys.idempotency("shop.charge", task_id)
        placed = keys.new_id(near=claim)
        same = keys.new_id(near=task_id)  # a successor drawn in the task's partition
        calls = [
            keys.for_push(placed, claim), keys.for_abort(placed, claim),
            keys.for_start(task_id), keys.for_retry(task_id), keys.for_cancel(placed, claim),
            keys.for_commit(placed, claim, keep_trail=True),
            keys.for_commit(task_id, None, successor=same, chord=task_id),
            keys.for_dead_letter(placed, placed, claim),
            keys.for_release(placed, placed, claim), keys.for_release_done(placed),
            keys.for_release_abort(task_id, task_id, None), keys.for_checkpoint(task_id),
            keys.for_heartbeat([task_id, same]), keys.for_resurrected([task_id, same]),
            keys.for_schedule_take([task_id]), keys.for_schedule_sent([task_id]),
            keys.for_dlq_delete([task_id, same], "token"),
        ]  # fmt: skip
        for call in calls:
            assert len(_slots(call)) == 1, call
    for call in (keys.for_tick(), keys.for_lock_acquire("l"), keys.for_leader()):
        assert len(_slots(call)) == 1, call
    assert len(_slots([keys.admission_all, keys.admission_task("shop.charge")])) == 1


def test_a_batch_of_two_partitions_is_refused_not_sent() -> None:
    keys = _tagged()
    a = uuid.uuid4().hex
    b = next(i for i in (uuid.uuid4().hex for _ in range(100))
             if keys.partition_of(i) != keys.partition_of(a))  # fmt: skip
    with pytest.raises(ValueError, match="one partition"):
        keys.for_heartbeat([a, b])
    assert {len(ids) for ids in keys.by_partition([a, b]).values()} == {1}


def test_a_per_partition_index_is_never_asked_of_the_whole() -> None:
    keys = _tagged()
    with pytest.raises(ValueError, match="per partition"):
        _ = keys.expiry
    assert len({p.expiry for p in keys.parts()}) == 6
    assert keys.partition_of_key(keys.at(4).expiry) == 4


def test_a_push_draws_its_id_in_its_claims_partition_and_places_a_workflows_task_as_any(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = Config(partitions=6)
    monkeypatch.setattr(producer.config, "current", lambda: cfg)
    keys = KeySpace.of(cfg)
    claim = keys.idempotency("shop.charge", "order-1")
    for _ in range(20):
        drawn = producer._placed("shop.charge", None, "order-1")
        assert keys.partition_of(drawn) == keys.partition_of_key(claim)
    wrong = next(f"id-{n}" for n in range(100)
                 if keys.partition_of(f"id-{n}") != keys.partition_of_key(claim))  # fmt: skip
    with pytest.raises(ValueError, match="different partitions"):
        producer._placed("shop.charge", wrong, "order-1")
    # A workflow's task (a chain's step, a chord's member, a task with links) is placed
    # as any task: what follows it is handed over (store/handover.py).
    assert producer._placed("shop.charge", "celery-drawn", None) == "celery-drawn"


def test_a_debounced_push_is_refused_on_a_partitioned_store() -> None:
    spec = TaskSpec(name="shop.reindex", fn=lambda doc: doc)
    with pytest.raises(ConfigError, match="debounce_s= needs an unpartitioned store"):
        producer._debounced(spec, KeySpace.of(Config(partitions=6)), (1,), {}, Debounce(1000))
    plain = producer._debounced(spec, KeySpace.of(Config()), (1,), {}, Debounce(1000))
    assert plain is not None and plain.startswith("rl:db:shop.reindex:")


def test_partitions_out_of_range_are_refused() -> None:
    with pytest.raises(Exception, match="partitions must be between 1 and 1024"):
        Config(partitions=0)
