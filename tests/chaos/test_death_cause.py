"""Why a holder died, recorded on the task's history: a pool process's exit status as
its worker's main process saw it, or a whole worker's closed liveness connection. Real
workers, real signals."""

from __future__ import annotations

import json

import pytest

from relier_django.core.model import config
from relier_django.core.recovery.resurrector import Resurrector
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from testproject.celery import app
from testproject.demo import tasks
from testproject.harness import wait_until
from tests.chaos.test_resurrection import executions, running_pid

KEYS = KeySpace("rl")
# A 60 s TTL: only a death seen at once (the main process's report, the scanner's
# closed-connection check) brings the task back within the test's wait.
FAST = {
    "RELIER_HEARTBEAT_TTL_S": "60",
    "RELIER_SCAN_INTERVAL_S": "0.3",
    "RELIER_LEADER_LEASE_S": "2",
}


def causes(client, task_id: str) -> list[tuple[int, str]]:  # type: ignore[no-untyped-def]
    """The 'expired' entries of a task's history: live, or kept after its commit."""
    kept = client.hget(KEYS.trail(task_id), "history")
    if kept is not None:
        events = json.loads(kept)
    else:
        events = [json.loads(e) for e in client.lrange(KEYS.history(task_id), 0, -1)]
    # A 'died' entry is the main process's report, come after the scanner resurrected
    # the task for the same death (the pool process's connection closed first).
    found = {e["fence"]: e.get("cause", "") for e in events if e["event"] == "expired"}
    found.update({e["fence"]: e["cause"] for e in events if e["event"] == "died"})
    return sorted(found.items())


@pytest.mark.parametrize(
    ("how", "cause"),
    [("SIGKILL", "signal:SIGKILL"), ("SIGSEGV", "signal:SIGSEGV"), ("exit:3", "exit:3")],
)
def test_a_pool_process_death_is_recorded_with_its_exit_status(
    worker_factory, redis_client, how, cause
):
    # No scanner runs until the main process has reported: the pool process's closed
    # liveness connection would otherwise race its report (see the next test), and a
    # task resurrected and committed first keeps the cause the scanner saw.
    worker = worker_factory(extra_env={**FAST, "RELIER_EMBEDDED_RESURRECTOR": "false"})
    client = sync_client(config.current())
    label = f"dies-{how}"
    receipt = tasks.dies_once.push(label, how)
    reported = f"pool process died running task_id={receipt.task_id} fence=1: handed off"
    wait_until(lambda: reported in worker.log_text(), 30, what="the main process's report")
    outcomes = Resurrector(app, config.current(), "test").run_pass().outcomes
    assert outcomes == {"resurrected": 1}

    assert receipt.get(timeout=30) == 2
    assert executions(client, label) == [1, 2]
    assert causes(client, receipt.task_id) == [(1, cause)]


def test_with_the_scanner_racing_the_report_the_cause_is_one_or_the_other(
    worker_factory, redis_client
):
    worker_factory(extra_env=FAST)
    client = sync_client(config.current())
    receipt = tasks.dies_once.push("dies-raced", "SIGKILL")
    assert receipt.get(timeout=30) == 2
    assert executions(client, "dies-raced") == [1, 2]
    assert causes(client, receipt.task_id) in ([(1, "signal:SIGKILL")], [(1, "connection_closed")])


def test_a_whole_worker_killed_is_recorded_as_its_connection_closed(worker_factory, redis_client):
    worker_factory(name="survivor", queues=("elsewhere",), extra_env=FAST)
    doomed = worker_factory(name="doomed", queues=("celery",), extra_env=FAST)
    client = sync_client(config.current())
    receipt = tasks.dies_once.push("whole-worker", "sleep:30")
    running_pid(client, receipt.task_id)
    doomed.kill()

    assert receipt.get(timeout=30) == 2
    assert executions(client, "whole-worker") == [1, 2]
    assert causes(client, receipt.task_id) == [(1, "connection_closed")]
