"""Two-tier timeouts and checkpoints with a real worker: the soft hook runs while the
task goes on, the hard timeout cancels cooperatively (its finally runs) and dead-letters
it with its checkpoint; checkpoints carry across a worker's death and a DLQ release."""

from __future__ import annotations

import json
import time

import pytest

from relier_django import TaskFailed
from relier_django import dlq as django_dlq
from relier_django.core.model import config
from relier_django.core.store import checkpoint
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from testproject.demo import tasks
from testproject.harness import wait_until
from tests.leaks import assert_no_leaked_keys

KEYS = KeySpace("rl")
FAST = {"RELIER_HEARTBEAT_TTL_S": "2", "RELIER_SCAN_INTERVAL_S": "0.5"}


def decoded():
    return sync_client(config.current())


def test_hard_timeout_cancels_cooperatively_and_dead_letters_with_the_checkpoint(
    worker, redis_client
):
    receipt = tasks.slow_steps.push("slow", steps=100, step_s=0.1)
    with pytest.raises(TaskFailed) as failed:
        receipt.get(timeout=30)
    assert failed.value.reason == "hard_timeout"
    # The soft hook ran once, beside the task, and its checkpoint is what the DLQ keeps.
    assert decoded().lrange(f"demo:soft:{receipt.task_id}", 0, -1) == ["1"]
    assert decoded().lrange("demo:finally:slow", 0, -1) == ["1"]  # finally ran
    entry = django_dlq.store().get(receipt.task_id)
    assert entry.reason == "hard_timeout" and "hard_timeout (2.0 s)" in entry.data["exc_message"]
    state = entry.checkpoint
    assert state["soft_timeout"] is True and 10 <= state["step"] < 100
    assert decoded().llen("demo:exec:slow") == 1  # cancelled, not retried
    assert "hard timeout task_id=" in worker.log_text()


def test_a_task_within_its_timeouts_commits_and_leaves_no_checkpoint(worker, redis_client):
    receipt = tasks.slow_steps.push("quick", steps=3, step_s=0.05)
    assert receipt.get(timeout=30) == {"label": "quick", "steps": 3}
    assert decoded().llen(f"demo:soft:{receipt.task_id}") == 0
    assert_no_leaked_keys(redis_client)


def test_a_resurrected_incarnation_resumes_from_the_last_checkpoint(worker_factory, redis_client):
    # The survivor starts first, on a queue of its own: only a resurrection (through
    # the recovery queue every worker consumes) can bring the task to it.
    worker_factory(name="survivor", queues=("elsewhere",), extra_env=FAST)
    victim = worker_factory(name="victim", extra_env=FAST)
    receipt = tasks.resumable.push("resume", steps=12, step_s=0.25)
    task_key = KEYS.task(receipt.task_id)
    # Let it save a few checkpoints, then kill the whole worker mid-task.
    wait_until(lambda: "next" in (decoded().hget(task_key, "partial") or ""), 30, what="a save")
    time.sleep(0.6)
    victim.kill()
    result = receipt.get(timeout=60)
    starts = [int(s) for s in decoded().lrange("demo:resumed:resume", 0, -1)]
    assert starts[0] == 0 and len(starts) == 2 and starts[1] >= 2
    assert result["started_at"] == starts[1]
    assert_no_leaked_keys(redis_client)


def test_a_released_task_resumes_from_the_checkpoint_its_failure_kept(worker, redis_client):
    redis_client.set("demo:broken:phase", "1")
    receipt = tasks.fix_then_resume.push("phase")
    with pytest.raises(TaskFailed):
        receipt.get(timeout=30)
    entry = django_dlq.store().get(receipt.task_id)
    assert entry.checkpoint == {"phase": 1}
    redis_client.delete("demo:broken:phase")
    django_dlq.release_entry(entry.id, expected_fence=entry.fence)
    assert receipt.get(timeout=30)["resumed_from"] == {"phase": 1}
    seen = [json.loads(s) for s in decoded().lrange("demo:seen:phase", 0, -1)]
    assert seen == [None, {"phase": 1}]
    assert_no_leaked_keys(redis_client)


def test_a_checkpoint_over_the_limit_fails_the_task_with_a_clear_reason(worker, redis_client):
    receipt = tasks.checkpoint_bytes.push(200_000)  # over the 64 KiB default
    with pytest.raises(TaskFailed) as failed:
        receipt.get(timeout=30)
    assert "CheckpointTooLarge" in str(failed.value) and "CHECKPOINT_DIR" in str(failed.value)


def test_large_checkpoints_go_to_files_and_are_removed_on_commit(
    worker_factory, redis_client, tmp_path
):
    folder = tmp_path / "checkpoints"
    worker_factory(extra_env={"RELIER_CHECKPOINT_DIR": str(folder)})
    receipt = tasks.checkpoint_bytes.push(200_000, saves=3)
    # Read back whole, from a file; each accepted save removed the one before it.
    assert receipt.get(timeout=30) == {"bytes": 200_000, "files": 1}
    # The last file is removed just after the commit is in (the receipt may see the
    # result first).
    wait_until(lambda: not any(folder.rglob("*.json")), 10, what="the last checkpoint file")


def test_a_superseded_incarnation_cannot_overwrite_the_checkpoint(redis_client):
    from relier_django.core.push import idempotency, producer
    from relier_django.core.worker import fencing

    client = sync_client(config.current())
    env = producer.prepare(tasks.record.relier_spec, ("cp",), {})
    idempotency.store(KEYS, env, env.encode(), 60_000, 3).run(client)
    assert fencing.start(KEYS, env, "w:1", 10_000).run(client).started
    assert checkpoint.save(KEYS, env.id, env.fence, '{"inline":1}').run(client).accepted
    client.hincrby(KEYS.task(env.id), "fence", 1)  # a newer incarnation exists
    refused = checkpoint.save(KEYS, env.id, env.fence, '{"inline":2}').run(client)
    assert not refused.accepted and refused.value == env.fence + 1
    assert client.hget(KEYS.task(env.id), "partial") == '{"inline":1}'


def test_a_task_that_swallows_its_cancellation_is_still_dead_lettered(worker, redis_client):
    receipt = tasks.stubborn.push("stubborn")
    with pytest.raises(TaskFailed) as failed:
        receipt.get(timeout=30)
    assert failed.value.reason == "hard_timeout"  # not the "swallowed" it returned
    log = worker.log_text()
    # The hook raised: logged as the hook's failure, not the task's.
    assert "on_soft_timeout failed task_id=" in log and "the soft hook itself failed" in log
    assert decoded().llen("demo:exec:stubborn") == 1
