"""Fixtures: a private Redis Cluster for the session (3 masters, 3 replicas), and a
cluster client per test, flushed around it.

As everywhere in the suite, nothing here connects to a Redis the suite did not start:
the cluster's nodes get free ports and temp dirs, and are stopped by PID.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.cluster import RedisCluster

from testproject.cluster import ClusterGroup

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterGroup]:
    """One private Redis Cluster for the session: 3 masters with a replica each."""
    group = ClusterGroup(tmp_path_factory.mktemp("cluster"), masters=3, replicas=1)
    try:
        yield group.start()
    finally:
        group.stop()


def _flush(group: ClusterGroup) -> None:
    # Masters only: their replicas follow, and a replica refuses writes.
    for master in group.masters():
        if group.alive(master):
            with master.client() as client:
                client.flushall()


@pytest.fixture
def cluster_client(redis_cluster: ClusterGroup) -> Iterator[RedisCluster]:
    """A cluster client on the session's cluster, which is flushed before and after the
    test: a test that wrote through a client of its own leaves nothing behind either."""
    _flush(redis_cluster)
    client = redis_cluster.client()
    try:
        yield client
    finally:
        client.close()
        _flush(redis_cluster)
