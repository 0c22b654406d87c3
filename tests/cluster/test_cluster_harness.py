"""The Redis Cluster harness (testproject/cluster.py) against real nodes: the slots are
split as redis-cli splits them, keys sit where the harness says, and a master killed
when replicated is failed over without losing a write, then rejoins as a replica."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from redis.cluster import RedisCluster
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from testproject import cluster as cluster_harness
from testproject.cluster import ClusterGroup


def test_three_masters_each_serve_a_third_of_the_slots(
    redis_cluster: ClusterGroup, cluster_client: RedisCluster
) -> None:
    masters = redis_cluster.masters()
    assert len(masters) == 3
    assert len(redis_cluster.nodes) == 6

    # The client's slot map (from CLUSTER SLOTS), not the harness's reading of
    # CLUSTER NODES: two sources that must agree.
    slots = cluster_client.nodes_manager.slots_cache
    assert len(slots) == REDIS_CLUSTER_HASH_SLOTS
    per_port = Counter(nodes[0].port for nodes in slots.values())
    assert set(per_port) == {m.port for m in masters}
    assert all(5461 <= count <= 5462 for count in per_port.values()), per_port

    # masters() is ordered by first slot, and master_of_slot agrees with the client.
    assert redis_cluster.master_of_slot(0) is masters[0]
    assert redis_cluster.master_of_slot(REDIS_CLUSTER_HASH_SLOTS - 1) is masters[-1]
    for slot in (0, 5460, 5461, 10922, 10923, 16383, 1234, 9999):
        assert redis_cluster.master_of_slot(slot).port == slots[slot][0].port

    # Every other node replicates exactly one master.
    replicas = [r for m in masters for r in redis_cluster.replicas_of(m)]
    assert all(len(redis_cluster.replicas_of(m)) == 1 for m in masters)
    assert sorted(n.port for n in [*masters, *replicas]) == sorted(
        n.port for n in redis_cluster.nodes
    )


def test_a_key_written_through_the_cluster_sits_on_node_of_key(
    redis_cluster: ClusterGroup, cluster_client: RedisCluster
) -> None:
    keys = {f"relier:test:{i}": f"value-{i}" for i in range(60)}
    for key, value in keys.items():
        assert cluster_client.set(key, value)
    for key, value in keys.items():
        assert cluster_client.get(key) == value.encode()

    owners = {key: redis_cluster.node_of_key(key) for key in keys}
    assert len({owner.port for owner in owners.values()}) == 3  # 60 keys reach every master
    for key, value in keys.items():
        # A plain client, no redirection: a key on another node would answer MOVED.
        with owners[key].client() as direct:
            assert direct.get(key) == value.encode()

    # Hash tags: one slot, so one node, for every key that shares the tag.
    tagged = [f"{{job-7}}:{part}" for part in ("a", "b", "c")]
    assert len({key_slot(k.encode()) for k in tagged}) == 1
    assert len({redis_cluster.node_of_key(k).port for k in tagged}) == 1


def test_failover_keeps_every_replicated_write_and_the_old_master_rejoins(
    tmp_path: Path,
) -> None:
    # A cluster of its own, so the session's keeps its shape; with a password, so that
    # the nodes' replication (masterauth) and the seed URL carry it too.
    with cluster_harness.redis_cluster(tmp_path / "failover", password="cluster s3cret/") as group:
        keys = {f"relier:failover:{i}": str(i) for i in range(200)}
        with group.client() as client:
            for key, value in keys.items():
                assert client.set(key, value)

        old = group.node_of_key("relier:failover:0")
        replicas_before = group.replicas_of(old)
        assert len(replicas_before) == 1
        masters_before = group.masters()

        assert group.kill_master_when_replicated(old) is old
        assert not group.alive(old)

        new = group.wait_for_failover(old)
        assert new is replicas_before[0]
        masters_after = group.masters()
        assert old not in masters_after
        assert masters_after == [new if m is old else m for m in masters_before]
        assert group.node_of_key("relier:failover:0") is new

        # A fresh client, seeded from the URL alone (password in it), reads every key.
        with RedisCluster.from_url(group.url) as fresh:
            assert {key: fresh.get(key) for key in keys} == {
                key: value.encode() for key, value in keys.items()
            }
            assert fresh.set("relier:failover:after", "1")

        group.restart(old)
        assert group.alive(old)
        with old.client(decode_responses=True) as client:
            replication = client.info("replication")
        assert replication["role"] == "slave"
        assert replication["master_port"] == new.port
        assert replication["master_link_status"] == "up"
        assert group.replicas_of(new) == [old]
        assert group.masters() == masters_after
        with old.client(decode_responses=True) as client:
            assert client.execute_command("READONLY")  # a replica answers reads with this
            assert client.get("relier:failover:0") == "0"

        processes = [node.process for node in group.nodes]
    # Stopped by PID on the way out: every node has exited and been reaped.
    assert all(p is not None and p.poll() is not None for p in processes)


def test_fewer_than_three_masters_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 3 masters"):
        ClusterGroup(tmp_path, masters=2)
