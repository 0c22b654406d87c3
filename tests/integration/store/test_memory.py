"""What a queued task costs Redis's memory (issue 37; docs/operations.md, the optional
``hash-max-listpack-value``): a task with small arguments fits Redis's compact hash
encoding once the server allows values of 1 KB, and runs as any other."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from relier_django.core.store.keys import KeySpace
from testproject.demo import tasks

KEYS = KeySpace("rl")


@pytest.fixture
def listpack_1024(redis_client: redis.Redis) -> Iterator[None]:
    default = redis_client.config_get("hash-max-listpack-value")["hash-max-listpack-value"]
    redis_client.config_set("hash-max-listpack-value", 1024)
    try:
        yield
    finally:
        redis_client.config_set("hash-max-listpack-value", default)


def test_a_queued_task_with_small_arguments_is_a_hash_table_by_default(
    redis_client: redis.Redis,
) -> None:
    """Its envelope is longer than the default 64 bytes: the reason for the option."""
    receipt = tasks.record.push_with(on_commit=False).push("default")
    assert redis_client.object("encoding", KEYS.task(receipt.task_id)) == b"hashtable"


def test_a_queued_task_with_small_arguments_stays_compact_when_the_server_allows_1kb(
    redis_client: redis.Redis, listpack_1024: None, worker_factory
) -> None:
    receipt = tasks.record.push_with(on_commit=False).push("compact")
    key = KEYS.task(receipt.task_id)
    assert redis_client.object("encoding", key) == b"listpack"
    assert redis_client.memory_usage(key) < 1000  # about 1,670 B as a hash table
    worker_factory()
    assert receipt.get(timeout=30)["label"] == "compact"
