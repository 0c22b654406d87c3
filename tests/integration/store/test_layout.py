"""A store keeps the layout it was created with (PARTITIONS, CLUSTER; store/layout.py):
a process configured for another would store tasks where no worker looks, or look for
them where none are. The first process (a worker, a check, a push) records the layout; a worker
configured otherwise refuses to start, a producer refuses to push, and ``manage.py
check`` reports relier.E015."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from django.core import checks

from relier_django.core.model.errors import ConfigError
from relier_django.core.store import layout
from testproject.demo import tasks
from testproject.harness import CeleryWorker, RedisServer


@pytest.fixture
def laid_out_for_six(redis_client: redis.Redis) -> Iterator[None]:
    """The session's store, recorded as created with 6 partitions by another process."""
    layout._matched.clear()  # this process has checked no store yet
    redis_client.set("rl:layout", "6:tagged")
    yield
    layout._matched.clear()


def test_a_push_records_the_layout_of_a_fresh_store_and_asks_once_per_process(
    redis_client: redis.Redis,
) -> None:
    """Whoever reaches a fresh store first records it (here a producer); after its
    first push, a producer asks nothing (issue 37: the read was a second round trip on
    every push until a worker stamped the store)."""
    layout._matched.clear()
    tasks.record.push_with(on_commit=False).push("before-any-worker")
    assert redis_client.get("rl:layout") == b"1:plain"
    before = redis_client.info("commandstats")
    tasks.record.push_with(on_commit=False).push("asks-nothing")
    after = redis_client.info("commandstats")
    for command in ("cmdstat_get", "cmdstat_set"):
        assert after.get(command, {}).get("calls", 0) == before.get(command, {}).get("calls", 0)
    redis_client.set("rl:layout", "6:tagged")  # read once per process once recorded
    tasks.record.push_with(on_commit=False).push("not-read-again")


def test_a_push_into_a_store_of_another_layout_is_refused_and_stores_nothing(
    laid_out_for_six: None, redis_client: redis.Redis
) -> None:
    with pytest.raises(
        ConfigError, match=r"laid out for PARTITIONS=6 .* configured for PARTITIONS=1"
    ):
        tasks.record.push_with(on_commit=False).push("lost-if-stored")
    assert redis_client.zcard("rl:expiry") == 0 and redis_client.llen("celery") == 0


def test_manage_py_check_reports_the_layout_mismatch(laid_out_for_six: None) -> None:
    found = [m for m in checks.run_checks(tags=["relier"]) if m.id == "relier.E015"]
    assert len(found) == 1 and "PARTITIONS=6" in found[0].msg


def test_a_worker_configured_for_another_layout_refuses_to_start(
    laid_out_for_six: None, redis_server: RedisServer, tmp_path
) -> None:
    worker = CeleryWorker(
        redis_url=redis_server.url, log_dir=tmp_path, name="misplaced",
        extra_env={"RELIER_ALLOW_UNSAFE_REDIS": "true"},
    )  # fmt: skip
    try:
        worker.start(wait=False)
        assert worker.process is not None
        assert worker.process.wait(60) != 0
        log = worker.log_text()
        assert "laid out for PARTITIONS=6" in log and "refuses to start" in log, log
        assert "ready." not in log
    finally:
        worker.stop()
