"""Deaths found by connection (store/liveness.py, recovery/deaths.py), with real workers.

The heartbeat TTL stays at its default (10 s) in every test here but the SIGSTOP one:
a task that runs again before its TTL could have run out was brought back by the death
of its holder's connection, which the metrics name (cause ``process_death``).
"""

from __future__ import annotations

import time

from relier_django import metrics
from relier_django.core.model import config
from relier_django.core.recovery import deaths
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from testproject.demo import tasks
from testproject.harness import wait_until

KEYS = KeySpace("rl")
QUICK_SCAN = {"RELIER_SCAN_INTERVAL_S": "0.5"}


def _redis_ms(client) -> int:  # type: ignore[no-untyped-def]
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _running(client, task_id: str, fence: int = 1) -> None:  # type: ignore[no-untyped-def]
    def running() -> bool:
        found = client.hmget(KEYS.task(task_id), "state", "fence")
        return found == ["running", str(fence)]

    wait_until(running, 30, what=f"task {task_id} running at fence {fence}")


def test_a_whole_worker_killed_is_found_by_its_connection_long_before_its_ttl(
    worker_factory, redis_client
):
    client = sync_client(config.current())
    worker_factory(name="survivor", queues=("elsewhere",), extra_env=QUICK_SCAN)
    doomed = worker_factory(name="doomed", extra_env=QUICK_SCAN)
    receipt = tasks.work.push("pd-whole", 2.0)
    _running(client, receipt.task_id)
    killed_ms = _redis_ms(client)
    doomed.kill()  # SIGKILL, main process and pool: nothing is handed off by the worker

    _running(client, receipt.task_id, fence=2)
    restarted_ms = int(client.hget(KEYS.task(receipt.task_id), "started_ms"))
    assert restarted_ms - killed_ms < 10_000  # before the 10 s TTL could have run out
    wait_until(lambda: receipt.status == "SUCCESS", 30)
    assert client.lrange("demo:exec:pd-whole", 0, -1) == ["2"]  # once, by the survivor
    found = metrics.read()
    assert dict(found.resurrections) == {
        **dict.fromkeys(found.resurrections, 0),
        "process_death": 1,
    }
    # Dated from the last check that listed its connection, or (a process no check
    # listed) the check before the one that missed it: at most one check off the kill.
    observed_ms = found.recovery["process_death"].sum_s * 1000
    assert observed_ms >= restarted_ms - killed_ms - deaths.CHECK_S * 1000


def test_the_leader_killed_with_its_worker_is_replaced_by_its_connection_not_its_lease(
    worker_factory, redis_client
):
    client = sync_client(config.current())
    leader = worker_factory(name="leader", extra_env=QUICK_SCAN)
    wait_until(lambda: client.get(KEYS.leader) is not None, 10, what="a leader")
    assert leader.hostname in client.get(KEYS.leader)
    worker_factory(name="survivor", queues=("elsewhere",), extra_env=QUICK_SCAN)
    receipt = tasks.work.push("pd-leader", 2.0)
    _running(client, receipt.task_id)
    leader.kill()

    _running(client, receipt.task_id, fence=2)
    assert "survivor" in client.get(KEYS.leader)
    wait_until(lambda: receipt.status == "SUCCESS", 30)
    assert metrics.read().resurrections["process_death"] == 1


def test_a_redis_restart_makes_no_false_death(worker_factory, redis_server, redis_client):
    client = sync_client(config.current())
    worker_factory(extra_env=QUICK_SCAN)
    receipt = tasks.work.push("pd-restart", 4.0)
    _running(client, receipt.task_id)
    redis_server.restart(down_s=0.5)  # every connection drops, then comes back

    wait_until(lambda: receipt.status == "SUCCESS", 60, what="the task to commit")
    assert sync_client(config.current()).lrange("demo:exec:pd-restart", 0, -1) == ["1"]
    found = metrics.read()
    assert sum(found.resurrections.values()) == 0  # its live holder was never declared dead


def test_a_frozen_worker_keeps_its_connection_and_is_recovered_by_its_ttl(
    worker_factory, redis_client
):
    client = sync_client(config.current())
    fast = {**QUICK_SCAN, "RELIER_HEARTBEAT_TTL_S": "1.5", "RELIER_LEADER_LEASE_S": "2"}
    worker_factory(name="survivor", queues=("elsewhere",), extra_env=fast)
    frozen = worker_factory(name="frozen", extra_env=fast)
    receipt = tasks.work.push("pd-frozen", 2.0)
    _running(client, receipt.task_id)
    frozen.stop_group()  # SIGSTOP: alive, connections open, no heartbeat
    try:
        _running(client, receipt.task_id, fence=2)
        found = metrics.read()
        assert found.resurrections["heartbeat"] == 1
        assert found.resurrections["process_death"] == 0
    finally:
        frozen.cont_group()
    wait_until(lambda: receipt.status == "SUCCESS", 30)
    time.sleep(2.5)  # the zombie's own run ends (2 s) and tries to commit
    assert client.lrange("demo:exec:pd-frozen", 0, -1).count("2") == 1
    assert metrics.read().counters["committed"] == 1


def test_a_heartbeat_ttl_that_runs_out_is_acted_on_within_a_check_not_at_the_next_pass(
    worker_factory, redis_client
):
    # Passes a minute apart: only the leader's check of deadlines just passed can bring
    # the frozen worker's task back within the wait below.
    slow_scan = {"RELIER_SCAN_INTERVAL_S": "60", "RELIER_HEARTBEAT_TTL_S": "1.5"}
    client = sync_client(config.current())
    survivor = worker_factory(name="survivor", queues=("elsewhere",), extra_env=slow_scan)
    wait_until(lambda: survivor.hostname in (client.get(KEYS.leader) or ""), 10, what="lead")
    frozen = worker_factory(name="frozen", extra_env=slow_scan)
    receipt = tasks.work.push("pd-ttl-check", 2.0)
    _running(client, receipt.task_id)
    frozen.stop_group()  # SIGSTOP: alive, connections open, no heartbeat
    try:
        _running(client, receipt.task_id, fence=2)  # within 30 s, the next pass is at 60 s
        assert metrics.read().resurrections["heartbeat"] == 1
    finally:
        frozen.cont_group()
    wait_until(lambda: receipt.status == "SUCCESS", 30)


def _starts(client, label: str) -> list[tuple[int, float]]:  # type: ignore[no-untyped-def]
    """``(fence, time)`` of each start of demo.work ``label``."""
    found = []
    for entry in client.lrange(f"demo:start:{label}", 0, -1):
        fence, at, _pid = entry.split(":")
        found.append((int(fence), float(at)))
    return found


def test_a_resurrected_task_runs_ahead_of_the_taking_workers_prefetched_backlog(
    worker_factory, redis_client
):
    client = sync_client(config.current())
    busy = worker_factory(
        name="busy", concurrency=1, queues=("elsewhere",),
        extra_args=("--prefetch-multiplier", "4"),
    )  # fmt: skip
    victim = worker_factory(name="victim", concurrency=1)
    receipt = tasks.work.push("pd-ahead", 3.0)
    _running(client, receipt.task_id)
    fills = [f"pd-fill-{i}" for i in range(8)]
    for label in fills:  # 2 s each: the busy worker runs one and holds 4 in its buffer
        tasks.work.apply_async((label, 2.0), queue="elsewhere")
    wait_until(lambda: _starts(client, fills[0]), 30, what="the busy worker's first fill")
    killed_at = time.time()
    victim.kill()

    wait_until(lambda: receipt.status == "SUCCESS", 60, what="the resurrected task")
    (restarted_at,) = [at for fence, at in _starts(client, "pd-ahead") if fence == 2]
    ahead = [
        label for label in fills
        if any(killed_at < at < restarted_at for _, at in _starts(client, label))
    ]  # fmt: skip
    # Taken at the first free prefetch slot (a fill starting), it runs next: at most one
    # more fill starts in the time its holder's death takes to be found. Behind the
    # buffer it would wait for the 3 fills held there as well.
    assert len(ahead) <= 2, (ahead, busy.log_text()[-3000:])
    wait_until(lambda: all(client.llen(f"demo:exec:{label}") for label in fills), 60)
