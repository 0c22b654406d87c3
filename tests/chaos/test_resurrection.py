"""G1/G2/G3 under real faults: SIGKILLed children and workers, paused (zombie)
workers, poison tasks, racing resurrectors, a Redis crash. Exact counts throughout."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from relier_django import TaskFailed
from relier_django.core.dlq.store import DeadLetterStore
from relier_django.core.model import config
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from testproject.celery import app
from testproject.demo import tasks
from testproject.harness import wait_until
from tests.leaks import assert_no_leaked_keys

KEYS = KeySpace("rl")
FAST = {
    "RELIER_HEARTBEAT_TTL_S": "1.5",
    "RELIER_SCAN_INTERVAL_S": "0.3",
    "RELIER_LEADER_LEASE_S": "2",
}


@pytest.fixture
def fast_worker(worker_factory):
    def start(**kwargs):
        return worker_factory(extra_env={**FAST, **kwargs.pop("extra_env", {})}, **kwargs)

    return start


def running_pid(client, task_id: str) -> int:
    """PID of the pool process running ``task_id`` (from the task's ``worker`` field)."""

    def pid():
        hash_ = client.hgetall(KEYS.task(task_id))
        return hash_.get("state") == "running" and int(hash_["worker"].rsplit(":", 1)[1])

    return wait_until(pid, 30, what=f"task {task_id} to run")


def executions(client, label: str) -> list[int]:
    return [int(r.split(":")[0]) for r in client.lrange(f"demo:exec:{label}", 0, -1)]


def test_sigkill_of_a_child_mid_task_completes_it_exactly_once_elsewhere(fast_worker, redis_client):
    worker = fast_worker()
    client = sync_client(config.current())
    receipt = tasks.record.push("k-child", 2)
    worker.kill_child(running_pid(client, receipt.task_id))

    result = receipt.get(timeout=30)
    assert result["fence"] == 2 and result["runs"] == 1
    assert executions(client, "k-child") == [2]  # the killed run never got to record
    assert client.get(KEYS.result(receipt.task_id)) is not None
    assert client.zcard(KEYS.expiry) == 0


def test_a_child_killed_mid_task_is_handed_off_without_waiting_for_its_ttl(
    fast_worker, redis_client
):
    # With a 60 s TTL, only a hand-off can bring it back within 30 s: the main
    # process's (billiard reports the death) or the scanner's (the pool process's
    # liveness connection closed), whichever sees the death first; both are fenced.
    worker = fast_worker(extra_env={"RELIER_HEARTBEAT_TTL_S": "60"})
    client = sync_client(config.current())
    receipt = tasks.sync_record.push("k-lost", 2)
    worker.kill_child(running_pid(client, receipt.task_id))

    result = receipt.get(timeout=30)
    assert result["fence"] == 2 and result["runs"] == 1
    assert executions(client, "k-lost") == [2]
    by_main = f"pool process died running task_id={receipt.task_id} fence=1: handed off"
    by_scanner = "holder found dead (its connection is gone)"
    log = worker.log_text()
    assert by_main in log or by_scanner in log


def test_sigkill_of_a_whole_worker_holding_a_prefetched_backlog_runs_every_task_once(
    fast_worker, redis_client
):
    # The survivor is up first, on a queue of its own: it gets only what relier
    # re-dispatches (the recovery queue is added to every worker).
    fast_worker(name="survivor", queues=("elsewhere",))
    doomed = fast_worker(name="doomed", queues=("celery",))
    client = sync_client(config.current())
    receipts = [tasks.record.push(f"k-whole-{i}", 3) for i in range(8)]
    for r in receipts[:2]:
        running_pid(client, r.task_id)
    # 2 running, 6 prefetched (received, unacknowledged) when the whole worker dies.
    wait_until(lambda: doomed.log_text().count("received") == 8, 10, what="the prefetch")
    doomed.kill()

    for i, r in enumerate(receipts):
        assert r.get(timeout=60)["fence"] == 2
        assert executions(client, f"k-whole-{i}") == [2]  # exactly once, by the survivor
    assert_no_leaked_keys(client)


def test_a_resurrected_incarnation_knows_its_fence_and_resurrection_count(
    fast_worker, redis_client
):
    fast_worker()
    result = tasks.fragile.push("fragile-once", 1).get(timeout=30)  # dies once
    assert result == {"runs": 2, "fence": 2, "attempt": 1, "resurrections": 1}


def test_a_zombie_cannot_commit_after_it_resumes(fast_worker, redis_client):
    worker = fast_worker()
    client = sync_client(config.current())
    receipt = tasks.sync_record.push("zombie", 1)
    pid = running_pid(client, receipt.task_id)
    os.kill(pid, signal.SIGSTOP)  # the child stops; its heartbeats stop with it
    try:
        result = receipt.get(timeout=30)  # resurrected and committed by the other child
    finally:
        os.kill(pid, signal.SIGCONT)
    assert result["fence"] == 2

    line_rejected = f"stale commit rejected task_id={receipt.task_id} fence=1"
    line_cancelled = f"incarnation cancelled: superseded task_id={receipt.task_id} fence=1"
    wait_until(
        lambda: line_rejected in worker.log_text() or line_cancelled in worker.log_text(),
        15,
        what="the zombie to be refused",
    )
    stored = json.loads(client.get(KEYS.result(receipt.task_id)))
    assert stored["result"]["fence"] == 2  # the committed result is the new incarnation's


def test_a_task_that_kills_its_worker_every_time_lands_in_the_dlq(fast_worker, redis_client):
    fast_worker()
    client = sync_client(config.current())
    receipt = tasks.self_destruct.push("poison")
    with pytest.raises(TaskFailed) as err:
        receipt.get(timeout=60)
    assert err.value.reason == "resurrection_limit"
    assert executions(client, "poison") == [1, 2, 3]  # first run + max_resurrections=2
    assert_no_leaked_keys(client)
    entry = DeadLetterStore(client, KEYS).get(receipt.task_id)
    starts = [h for h in entry.history if h["event"] == "start"]
    assert [h["fence"] for h in starts] == [1, 2, 3]
    assert [h["fence"] for h in entry.history if h["event"] == "expired"] == [1, 2, 3]
    assert entry.data["envelope"]["args"] == ["poison"]
    # Its last death, as whichever of the main process and the scanner acted first saw it.
    assert entry.data["cause"] in ("signal:SIGKILL", "connection_closed")


def test_two_resurrectors_racing_dispatch_each_expired_task_once(redis_client):
    from relier_django.core.push import idempotency, producer
    from relier_django.core.recovery.resurrector import Resurrector
    from relier_django.core.worker import fencing

    client = sync_client(config.current())
    envs = [producer.prepare(tasks.record.relier_spec, (f"race-{i}",), {}) for i in range(200)]
    for env in envs:
        idempotency.store(KEYS, env, env.encode(), 60_000, 3).run(client)
        fencing.start(KEYS, env, "dead-worker:1", 1).run(client)  # expires at once
    wait_until(lambda: client.time()[1] is not None, 1)

    sent: list[tuple[str, int]] = []
    lock = threading.Lock()

    class CountingApp:
        amqp, conf = app.amqp, app.conf  # the real queues, where the recovery queue goes

        def send_task(self, name, args, task_id, **kwargs):
            with lock:
                sent.append((task_id, json.loads(args[0])["fence"]))

        def connection_for_write(self):
            raise RuntimeError("no broker in this test")

    cfg = config.current()
    scanners = [Resurrector(CountingApp(), cfg, f"scanner-{i}") for i in range(2)]
    barrier = threading.Barrier(2)
    reports = []

    def scan(r):
        barrier.wait()
        reports.append(r.run_pass())

    threads = [threading.Thread(target=scan, args=(r,)) for r in scanners]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(t for t, _ in sent) == sorted(e.id for e in envs)  # each exactly once
    assert {f for _, f in sent} == {2}
    assert sum(r.resurrected for r in reports) == 200


# What a producer runs: push, with the broker's publish replaced by the producer's
# own SIGKILL, so it dies with the task stored and no message sent. It names the task
# first, as the publish would have.
_PUSH_THEN_DIE = """
import os, signal, django
django.setup()
from relier_django.core.broker import publish

def die(app, env, *args, **kwargs):
    print(env.id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

publish.send = die
from testproject.demo import tasks
tasks.record.push("orphan")
"""


def test_a_producer_killed_between_store_and_send_loses_nothing(
    fast_worker, redis_server, redis_client
):
    """operations.md: with the broker elsewhere (here another database), push stores,
    then publishes. A producer that dies in between leaves a stored task that no
    broker holds; the queued grace brings it back, fenced, and it runs once."""
    import subprocess
    import sys

    from testproject.harness import REPO_ROOT, worker_env

    broker_url = redis_server.url.rsplit("/", 1)[0] + "/1"
    elsewhere = {"CELERY_BROKER_URL": broker_url, "RELIER_QUEUED_GRACE_S": "2"}
    fast_worker(extra_env=elsewhere)
    producer = subprocess.run(
        [sys.executable, "-c", _PUSH_THEN_DIE],
        env=worker_env(redis_server.url, elsewhere),
        cwd=REPO_ROOT,
        capture_output=True,
        timeout=60,
    )
    assert producer.returncode == -signal.SIGKILL, producer.stderr.decode()[-2000:]
    task_id = producer.stdout.decode().strip()
    client = sync_client(config.current())
    assert client.exists(KEYS.task(task_id))  # the dead producer had stored it

    wait_until(lambda: client.exists(KEYS.result(task_id)), 60, what="the orphan to commit")
    assert executions(client, "orphan") == [2]  # once, as a new incarnation
    assert json.loads(client.get(KEYS.result(task_id)))["result"]["fence"] == 2


def test_redis_crash_and_restart_from_aof_mid_run_loses_nothing(
    fast_worker, redis_server, redis_client
):
    # A message kombu pops at the instant Redis dies is lost by the broker (documented
    # in docs/operations.md); the queued grace brings it back. Shortened here so that
    # path is exercised within the test instead of after the default hour.
    fast_worker(extra_env={"RELIER_QUEUED_GRACE_S": "4"})
    receipts = [tasks.record.push(f"aof-{i}", 0.5) for i in range(12)]
    wait_until(lambda: redis_client.llen("demo:exec:aof-0"), 30, what="the first task")
    redis_server.restart()  # kill -9, then the same port and dir: reload from AOF

    # Every task commits: the ones whose own Redis calls failed during the outage
    # were retried (retry_on), the ones whose worker-side calls failed were resurrected.
    results = [r.get(timeout=90) for r in receipts]
    assert [r["label"] for r in results] == [f"aof-{i}" for i in range(12)]
    fresh = redis_server.client(decode_responses=True)
    assert fresh.zcard(KEYS.dlq) == 0
    assert fresh.zcard(KEYS.expiry) == 0  # nothing left in flight
    fresh.close()


def test_sigterm_drains_short_tasks_in_place_and_hands_the_rest_off(worker_factory, redis_client):
    ttl_s = 20.0  # long on purpose: only a hand-off explains a restart well within it
    env = {"RELIER_HEARTBEAT_TTL_S": str(ttl_s), "RELIER_SCAN_INTERVAL_S": "0.3",
           "RELIER_DRAIN_TIMEOUT_S": "4"}  # fmt: skip
    leaving = worker_factory(name="leaving", concurrency=4, queues=("celery",), extra_env=env)
    # The survivor consumes only the recovery queue (added by relier, not by -Q).
    worker_factory(name="survivor", queues=("elsewhere",), extra_env=env)
    client = sync_client(config.current())

    short = [tasks.record.push(f"short-{i}", 1.5) for i in range(2)]
    long_ = [tasks.record.push(f"long-{i}", 12) for i in range(2)]
    for r in short + long_:
        running_pid(client, r.task_id)
    reserved = [tasks.record.push(f"reserved-{i}", 0.5) for i in range(3)]
    wait_until(lambda: leaving.log_text().count("received") >= 7, 10, what="prefetch")

    leaving.terminate(wait_s=None)  # SIGTERM to the main process only
    sigterm_at = time.monotonic()

    def restarted(receipt) -> bool:
        fields = client.hgetall(KEYS.task(receipt.task_id))
        return fields.get("fence") == "2" and fields.get("state") == "running"

    for r in long_:
        wait_until(lambda r=r: restarted(r), ttl_s, what="the long task to restart elsewhere")
    restart_s = time.monotonic() - sigterm_at

    assert [r.get(timeout=30)["fence"] for r in short] == [1, 1]  # finished in place
    assert [r.get(timeout=30)["fence"] for r in reserved] == [2, 2, 2]  # handed off at once
    assert [r.get(timeout=60)["fence"] for r in long_] == [2, 2]  # handed off after the drain
    assert restart_s < ttl_s / 2, f"hand-off took {restart_s:.1f}s"
    for label in ["short-0", "short-1", "long-0", "long-1"]:
        assert len(executions(client, label)) == 1  # cancelled runs never recorded
    leaving.process.wait(30)
    assert leaving.process.returncode == 0
    assert_no_leaked_keys(client)
    assert "handed off 3 reserved task(s)" in leaving.log_text()
    assert "handed off 2 running task(s)" in leaving.log_text()


REDELIVER_FAST = {
    **FAST,
    "CELERY_VISIBILITY_TIMEOUT": "4",
    "CELERY_UNACKED_RESTORE_INTERVAL": "0.5",
    "CELERY_UNACKED_RESTORE_THROTTLE": "1",
}


def _kill_a_worker_holding_four(worker_factory, env: dict[str, str]):  # type: ignore[no-untyped-def]
    """Four tasks on a one-process worker (one running, three reserved), the worker
    SIGKILLed, a replacement started (as a supervisor would): returns the receipts and
    the two workers that may see the broker's redeliveries."""
    survivor = worker_factory(name="survivor", concurrency=2, queues=("elsewhere",), extra_env=env)
    doomed = worker_factory(name="doomed", concurrency=1, queues=("celery",), extra_env=env)
    client = sync_client(config.current())
    receipts = [tasks.record.push(f"redeliver-{i}", 2) for i in range(4)]
    running_pid(client, receipts[0].task_id)
    wait_until(lambda: doomed.log_text().count("received") >= 4, 10, what="prefetch")
    doomed.kill()  # 1 running (acked) + 3 reserved (not acked) die with it
    successor = worker_factory(name="successor", concurrency=2, queues=("celery",), extra_env=env)
    return receipts, (survivor, successor)


def test_the_brokers_own_redelivery_after_a_resurrection_is_refused_as_stale(
    worker_factory, redis_client
):
    """On kombu's own transport (a worker not on relier_django's, e.g. mid-upgrade)."""
    env = {**REDELIVER_FAST, "CELERY_BROKER_TRANSPORT": "redis"}
    receipts, (survivor, successor) = _kill_a_worker_holding_four(worker_factory, env)
    client = sync_client(config.current())

    assert [r.get(timeout=30)["fence"] for r in receipts] == [2, 2, 2, 2]
    # After the visibility timeout kombu hands the 3 unacked originals (fence 1) to the
    # survivor; start.lua refuses each one: 'stale' while fence 2 is still unfinished,
    # 'gone' once it committed.
    for r in receipts[1:]:
        line = f"message refused task_id={r.task_id} fence=1 reason="
        wait_until(
            lambda line=line: line in survivor.log_text() + successor.log_text(),
            30,
            what="the stale redelivery",
        )
    for i in range(4):
        assert executions(client, f"redeliver-{i}") == [2]  # each ran exactly once


def test_on_relier_s_transport_a_dead_workers_reserved_tasks_come_back_once(
    worker_factory, redis_client
):
    """relier_django's transport keeps no unacked copy of its messages: the reserved
    tasks come back through their heartbeats alone, and kombu redelivers nothing."""
    receipts, (survivor, successor) = _kill_a_worker_holding_four(worker_factory, REDELIVER_FAST)
    client = sync_client(config.current())

    assert [r.get(timeout=30)["fence"] for r in receipts] == [2, 2, 2, 2]
    time.sleep(6)  # past the 4 s visibility timeout and a restore pass
    logs = survivor.log_text() + successor.log_text()
    assert "message refused" not in logs
    assert redis_client.hlen("unacked") == 0 and redis_client.llen("celery") == 0
    for i in range(4):
        assert executions(client, f"redeliver-{i}") == [2]


def test_a_scanner_with_a_skewed_clock_resurrects_nothing_early(redis_client, monkeypatch):

    from relier_django.core.push import idempotency, producer
    from relier_django.core.recovery.resurrector import Resurrector
    from relier_django.core.worker import fencing

    client = sync_client(config.current())
    env = producer.prepare(tasks.record.relier_spec, ("skew",), {})
    idempotency.store(KEYS, env, env.encode(), 60_000, 3).run(client)
    fencing.start(KEYS, env, "w:1", 10_000).run(client)  # alive for 10 s more
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 3600)  # an hour fast
    report = Resurrector(None, config.current(), "skewed").run_pass()
    assert report.expired == 0 and report.resurrected == 0
    assert client.hget(KEYS.task(env.id), "fence") == "1"


def test_a_resurrection_limited_task_released_from_the_dlq_runs_with_a_fresh_fence(
    fast_worker, redis_client
):
    from relier_django.core.dlq.release import release
    from testproject.celery import app

    fast_worker()
    client = sync_client(config.current())
    receipt = tasks.fragile.push("fragile", 2)  # dies twice; max_resurrections=1
    with pytest.raises(TaskFailed) as err:
        receipt.get(timeout=60)
    assert err.value.reason == "resurrection_limit"

    released = release(app, config.current(), receipt.task_id)
    assert released.task_id == receipt.task_id
    result = released.get(timeout=60)
    # Fence above every earlier one; counters reset by the release.
    assert result == {"runs": 3, "fence": 3, "attempt": 1, "resurrections": 0}
    assert executions(client, "fragile") == [1, 2, 3]
    assert client.zcard(KEYS.dlq) == 0 and not client.exists(KEYS.dlq_entry(receipt.task_id))


def test_a_release_runs_once_even_when_two_operators_race(worker, redis_client):
    from relier_django.core.dlq.release import release
    from relier_django.core.model.errors import EntryNotReleasable
    from testproject.celery import app

    receipt = tasks.explode.push("race-release")
    with pytest.raises(TaskFailed):
        receipt.get(timeout=30)
    # Each operator releases the failure they saw. (The released task fails again and
    # gets a new entry under the same id; a slow operator must not release that one.)
    seen = DeadLetterStore(sync_client(config.current()), KEYS).get(receipt.task_id).fence
    outcomes = []
    barrier = threading.Barrier(8)

    def operator():
        barrier.wait()
        try:
            outcomes.append(release(app, config.current(), receipt.task_id, seen).task_id)
        except EntryNotReleasable:
            outcomes.append(None)

    threads = [threading.Thread(target=operator) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert outcomes.count(receipt.task_id) == 1 and outcomes.count(None) == 7
    with pytest.raises(TaskFailed):  # it raises again, and is back in the DLQ
        receipt.get(timeout=30)
    client = sync_client(config.current())
    assert client.llen("demo:exec:race-release") == 2  # pushed once, released once


def test_a_release_whose_dispatch_fails_leaves_the_entry_in_the_dlq(worker, redis_client):
    from relier_django.core.dlq.release import release

    receipt = tasks.explode.push("release-fails")
    with pytest.raises(TaskFailed):
        receipt.get(timeout=30)
    client = sync_client(config.current())
    before = DeadLetterStore(client, KEYS).get(receipt.task_id)

    class BrokerDown:
        tasks: dict = {}

        def send_task(self, *args, **kwargs):
            raise ConnectionError("broker unreachable")

    with pytest.raises(ConnectionError):
        release(BrokerDown(), config.current(), receipt.task_id)
    after = DeadLetterStore(client, KEYS).get(receipt.task_id)
    assert after is not None and after == before
    assert client.zscore(KEYS.dlq, receipt.task_id) is not None
    assert not client.exists(KEYS.task(receipt.task_id))  # the re-created task is gone again


def test_a_deep_recovery_queue_defers_resurrection_and_leaves_tasks_covered(redis_client, caplog):
    from relier_django.core.push import idempotency, producer
    from relier_django.core.recovery.resurrector import Resurrector
    from relier_django.core.worker import fencing
    from testproject.celery import app

    cfg = config.current().replace(recovery_max_depth=1)
    client = sync_client(cfg)
    env = producer.prepare(tasks.record.relier_spec, ("deep",), {})
    idempotency.store(KEYS, env, env.encode(), 60_000, 3).run(client)
    fencing.start(KEYS, env, "dead:1", 1).run(client)
    time.sleep(0.01)  # its 1 ms heartbeat TTL has run out before the pass looks
    app.send_task("demo.noop", args=["not consumed"], queue=cfg.recovery_queue)  # depth 1

    report = Resurrector(app, cfg, "braked").run_pass()
    assert report.expired == 1 and report.deferred == 1 and report.resurrected == 0
    assert client.hget(KEYS.task(env.id), "fence") == "1"  # untouched
    assert client.zscore(KEYS.expiry, env.id) is not None  # still covered
    assert "resurrection deferred: recovery queue" in caplog.text

    report = Resurrector(app, cfg.replace(recovery_max_depth=10), "released").run_pass()
    assert report.resurrected == 1


def test_a_release_pinned_to_a_failure_leaves_a_later_failure_alone(worker, redis_client):
    from relier_django.core.dlq.release import release
    from relier_django.core.model.errors import EntryNotReleasable
    from testproject.celery import app

    client = sync_client(config.current())
    receipt = tasks.explode.push("pinned")
    with pytest.raises(TaskFailed):
        receipt.get(timeout=30)
    store = DeadLetterStore(client, KEYS)
    first = store.get(receipt.task_id).fence
    release(app, config.current(), receipt.task_id, first)
    # It fails again: the entry now holds a later failure (higher fence).
    wait_until(
        lambda: (e := store.get(receipt.task_id)) is not None and e.fence > first,
        30,
        what="the second failure",
    )
    with pytest.raises(EntryNotReleasable, match=f"at fence {first}"):
        release(app, config.current(), receipt.task_id, first)  # a stale click
    assert client.llen("demo:exec:pinned") == 2
    assert DeadLetterStore(client, KEYS).get(receipt.task_id).fence == first + 1
