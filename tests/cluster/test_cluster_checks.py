"""``manage.py check`` with the store on a Redis Cluster: a durable cluster passes; a
master without AOF is named by its address (each master keeps its own partitions)."""

from __future__ import annotations

from testproject.cluster import ClusterGroup
from tests.cluster.stores import PARTITIONS
from tests.integration.django_app.test_checks import ids, relier, relier_messages

__all__ = ["relier"]  # the settings fixture, shared with test_checks.py


def test_a_durable_cluster_passes_every_store_check(redis_cluster: ClusterGroup, relier) -> None:
    relier(REDIS_URL=redis_cluster.url, CLUSTER=True, PARTITIONS=PARTITIONS)
    assert [i for i in ids() if i in ("relier.W001", "relier.E014", "relier.E016")] == []
    assert [i for i in ids() if i in ("relier.E003", "relier.E004", "relier.W004")] == []


def test_a_master_without_aof_is_named_by_its_address(redis_cluster: ClusterGroup, relier) -> None:
    master = redis_cluster.masters()[1]
    with master.client() as client:
        client.config_set("appendonly", "no")
    try:
        relier(REDIS_URL=redis_cluster.url, CLUSTER=True, PARTITIONS=PARTITIONS)
        found = [m for m in relier_messages() if m.id == "relier.E003"]
        assert len(found) == 1 and f"cluster master 127.0.0.1:{master.port}" in found[0].msg
    finally:
        with master.client() as client:
            client.config_set("appendonly", "yes")
