"""What the cluster tests share: the store's key space as this process is configured,
and the environment of a process whose store is a cluster (the broker stays a plain
Redis: kombu's transport does not support a cluster)."""

from __future__ import annotations

from relier_django.core.model.config import current
from relier_django.core.store.keys import KeySpace
from testproject.harness import RedisServer, worker_env

PARTITIONS = 6  # two per master of a 3-master cluster


def keys() -> KeySpace:
    """The key space of this process's current config."""
    return KeySpace.of(current())


def store_env(seed: str, broker: RedisServer, **extra: str) -> dict[str, str]:
    """The environment of a process with the store on the cluster that ``seed`` (a
    node's URL) names, and the broker on the plain Redis ``broker``."""
    return worker_env(broker.url, {
        "RELIER_REDIS_URL": seed, "RELIER_CLUSTER": "true",
        "RELIER_PARTITIONS": str(PARTITIONS), **extra,
    })  # fmt: skip


def relier_vars(env: dict[str, str]) -> dict[str, str]:
    """The RELIER_* part of ``env``: what a worker needs beyond the broker URL."""
    return {k: v for k, v in env.items() if k.startswith("RELIER_")}
