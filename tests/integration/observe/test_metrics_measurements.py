"""The metrics test_metrics.py's workload leaves at zero, each against a workload whose
truth is known: refused stale commits, releases, admission refusals, the resurrection
causes ``drain`` and ``unsent`` with their recovery latency, the gauges ``reserved``,
``recovering``, overdue, the recovery queue's depth and the oldest queued task's wait,
and the last hour's minutes.

Every act is the real script, called in this process (a task started, committed,
handed off, dead-lettered by the runner, resurrected by a real resurrector pass that
publishes to the real broker), so each figure can be compared with exactly what was
done, to the millisecond where the store dates it. Each is read through
``relier_django.metrics.read()`` and again from its Prometheus text, under the name
and labels docs/observability.md gives it.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

import relier_django
from relier_django import AdmissionRejected, metrics
from relier_django.core.dlq.release import release
from relier_django.core.model import config, outcome
from relier_django.core.model.envelope import Envelope, decode
from relier_django.core.model.spec import TaskSpec
from relier_django.core.observe import measurements
from relier_django.core.observe.measurements import Figures, Minute
from relier_django.core.push import idempotency, producer
from relier_django.core.recovery.resurrector import Resurrector
from relier_django.core.store.cancel import Cancelled
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from relier_django.core.worker import fencing
from relier_django.core.worker.runner import Runner
from relier_django.dlq import release_entry
from testproject.celery import app
from testproject.demo import tasks
from testproject.harness import wait_until

KEYS = KeySpace("rl")
NONE = dict.fromkeys(measurements.COUNTERS, 0)
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def fails(label: str) -> None:
    raise ValueError(f"cannot process {label}")


FAILS = TaskSpec(name="t.figures_fails", fn=fails, queue="figures")


class RefusingBroker:
    """A Celery app whose broker refuses every message."""

    def send_task(self, *args: Any, **kwargs: Any) -> None:
        raise ConnectionError("the broker refused the message")


def _samples(found: Figures) -> Samples:
    """The reading as Prometheus reads it: (sample name, sorted labels) -> value."""
    text = metrics.exposition(found).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _now_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _stored(client: redis.Redis, label: str, grace_ms: int = 60_000) -> Envelope:
    """A task stored as push.lua stores it, and never sent."""
    env = producer.prepare(tasks.record.relier_spec, (label,), {})
    assert idempotency.store(KEYS, env, env.encode(), grace_ms, 3).run(client)
    return env


def _started(client: redis.Redis, label: str) -> Envelope:
    env = _stored(client, label)
    assert fencing.start(KEYS, env, "w:1", 60_000).run(client).started
    return env


def _dead_lettered(label: str) -> Envelope:
    """A task pushed, then run by the runner in this process: it raises, the DLQ files it."""
    receipt = producer.push(FAILS, app, (label,), {}, on_commit=False)
    env = decode(sync_client(config.current()).hget(KEYS.task(receipt.task_id), "env"))
    Runner(FAILS, app, config.current(), "test:1").run_blocking(env.encode())
    return env


def _recovery_queue(client: redis.Redis, queue: str) -> dict[str, Envelope]:
    """The envelopes a resurrector published to the recovery queue, by task id, as a
    worker would receive them (kombu's Redis messages, Celery's protocol 2 body)."""
    found = {}
    for message in client.lrange(queue, 0, -1):
        body = json.loads(base64.b64decode(json.loads(message)["body"]))
        env = decode(body[0][0])
        found[env.id] = env
    return found


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def test_a_fenced_off_incarnation_s_commit_is_refused_and_counted_stale_once(redis_client):
    client = sync_client(config.current())
    env = _started(client, "cancelled-while-running")
    assert relier_django.cancel(env.id) is Cancelled.WHILE_RUNNING

    refused = fencing.commit(KEYS, env, outcome.succeeded(1, env.fence), 60_000).run(client)
    assert (refused.accepted, refused.value) == (False, -1)  # the task is gone

    found = metrics.read()
    assert dict(found.counters) == {**NONE, "pushed": 1, "stale": 1, "cancelled": 1}
    samples = _samples(found)
    assert samples[("relier_stale_commits_refused_total", ())] == 1
    assert samples[("relier_tasks_cancelled_total", ())] == 1
    assert samples[("relier_tasks_committed_total", ())] == 0


def test_a_resurrected_task_s_zombie_commit_is_counted_stale_and_the_new_one_committed(
    redis_client,
):
    client = sync_client(config.current())
    cfg = config.current()
    env = _started(client, "zombie")
    client.zadd(KEYS.expiry, {env.id: _now_ms(client) - 1})  # its heartbeat ran out
    assert Resurrector(app, cfg, "figures").run_pass().outcomes == {"resurrected": 1}

    refused = fencing.commit(KEYS, env, outcome.succeeded(1, env.fence), 60_000).run(client)
    assert (refused.accepted, refused.value) == (False, 2)
    current = _recovery_queue(client, cfg.recovery_queue)[env.id]
    assert fencing.start(KEYS, current, "w:2", 60_000).run(client).started
    record = outcome.succeeded(1, current.fence)
    assert fencing.commit(KEYS, current, record, 60_000).run(client).accepted

    found = metrics.read()
    assert dict(found.counters) == {**NONE, "pushed": 1, "committed": 1, "stale": 1}
    assert found.resurrections == {
        "heartbeat": 1,
        "pool_death": 0,
        "drain": 0,
        "unsent": 0,
        "process_death": 0,
    }
    samples = _samples(found)
    assert samples[("relier_stale_commits_refused_total", ())] == 1
    assert samples[("relier_tasks_committed_total", ())] == 1
    assert samples[("relier_resurrections_total", (("cause", "heartbeat"),))] == 1


def test_a_release_is_counted_once_the_broker_took_it(redis_client):
    client = sync_client(config.current())
    env = _dead_lettered("to-release")
    with pytest.raises(ConnectionError):
        release(RefusingBroker(), config.current(), env.id)
    refused = metrics.read()
    assert refused.counters["released"] == 0 and refused.dlq_entries == 1  # back in the DLQ

    receipt = release_entry(env.id)

    assert receipt.task_id == env.id
    assert client.hget(KEYS.task(env.id), "fence") == "2"
    assert client.llen("figures") == 2  # the push's message and the release's
    found = metrics.read()
    assert dict(found.counters) == {**NONE, "pushed": 1, "released": 1}
    assert dict(found.dead_lettered) == {"exception": 1}
    assert found.dlq_entries == 0
    samples = _samples(found)
    assert samples[("relier_tasks_released_total", ())] == 1
    assert samples[("relier_tasks_dead_lettered_total", (("reason", "exception"),))] == 1
    assert samples[("relier_tasks_pushed_total", ())] == 1  # a release is no push


def test_a_push_past_the_admission_limit_is_counted_refused(redis_client):
    for i in range(3):  # demo.limited: admission_limit="3/m"
        tasks.limited.push(f"admitted-{i}")
    with pytest.raises(AdmissionRejected):
        tasks.limited.push("one too many")

    found = metrics.read()
    assert dict(found.counters) == {**NONE, "pushed": 3, "refused": 1}
    assert found.live.by_state["queued"] == 3  # the refused one stored nothing
    samples = _samples(found)
    assert samples[("relier_admission_refused_total", ())] == 1
    assert samples[("relier_tasks_pushed_total", ())] == 3


def test_drain_and_unsent_resurrections_and_their_recovery_are_measured_exactly(
    redis_client,
):
    """``drain``: dated from the hand-off. ``unsent``: dated from the send (the deadline
    minus the queued grace), so its recovery includes the grace it waited."""
    client = sync_client(config.current())
    cfg = config.current().replace(queued_grace_s=0.3)
    drained = _started(client, "drained")
    assert fencing.handoff(KEYS, [(drained.id, 1)], "running", cause="drain").run(client) == 1
    handed_ms = int(client.zscore(KEYS.expiry, drained.id))
    unsent = _stored(client, "never-sent", grace_ms=300)
    created_ms = int(client.hget(KEYS.task(unsent.id), "created_ms"))
    deadline = int(client.zscore(KEYS.expiry, unsent.id))
    assert deadline == created_ms + 300
    wait_until(lambda: _now_ms(client) > deadline, 10, what="the queued grace to run out")

    assert Resurrector(app, cfg, "figures").run_pass().outcomes == {"resurrected": 2}

    assert client.hget(KEYS.task(drained.id), "rc_seen") == str(handed_ms)
    assert client.hget(KEYS.task(unsent.id), "rc_seen") == str(created_ms)
    found = metrics.read()
    assert found.resurrections == {
        "heartbeat": 0,
        "pool_death": 0,
        "drain": 1,
        "unsent": 1,
        "process_death": 0,
    }
    assert all(h.count == 0 for h in found.recovery.values())  # none has started yet
    published = _recovery_queue(client, cfg.recovery_queue)
    assert {i: e.fence for i, e in published.items()} == {drained.id: 2, unsent.id: 2}
    started_ms = {}
    for task_id, env in published.items():
        assert fencing.start(KEYS, env, "w:2", 60_000).run(client).started
        started_ms[task_id] = int(client.hget(KEYS.task(task_id), "started_ms"))

    found = metrics.read()
    drain, lost = found.recovery["drain"], found.recovery["unsent"]
    assert (drain.count, lost.count) == (1, 1)
    assert found.recovery["heartbeat"].count == found.recovery["pool_death"].count == 0
    assert _ms(drain.sum_s) == started_ms[drained.id] - handed_ms
    assert _ms(lost.sum_s) == started_ms[unsent.id] - created_ms
    assert lost.sum_s >= 0.3  # at least the grace
    assert [found.phases[p].count for p in measurements.PHASES] == [2, 2, 2]
    phases_ms = sum(_ms(found.phases[p].sum_s) for p in measurements.PHASES)
    assert phases_ms == _ms(drain.sum_s) + _ms(lost.sum_s)
    assert sum(m.recoveries for m in found.minutes) == 2
    assert max(m.recovery_max_s for m in found.minutes) == max(drain.sum_s, lost.sum_s)
    samples = _samples(found)
    for cause, h in (("drain", drain), ("unsent", lost)):
        assert samples[("relier_resurrections_total", (("cause", cause),))] == 1
        assert samples[("relier_recovery_seconds_count", (("cause", cause),))] == 1
        assert samples[("relier_recovery_seconds_sum", (("cause", cause),))] == h.sum_s
    assert samples[("relier_recovery_detection_seconds_count", ())] == 2


def test_reserved_recovering_overdue_and_the_recovery_queue_read_the_store(redis_client):
    client = sync_client(config.current())
    cfg = config.current()
    reserved = _stored(client, "prefetched")
    held = [(reserved.id, 1)]
    assert fencing.heartbeat(KEYS, held, 60_000, state="queued", worker="w:1").run(client) == []
    handed = _started(client, "handed-off")
    assert fencing.handoff(KEYS, [(handed.id, 1)], "running", "pool_death").run(client) == 1

    before = metrics.read()
    assert before.live.by_state == {
        "queued": 0, "reserved": 1, "running": 0, "scheduled": 0, "recovering": 1,
    }  # fmt: skip
    assert before.live.overdue == 1  # the hand-off is due now; the reservation is not
    assert before.recovery_queue_depth == 0
    assert {t.task_id: t.worker for t in before.live.tasks if t.state == "reserved"} == {
        reserved.id: "w:1"
    }
    samples = _samples(before)
    assert samples[("relier_tasks_in_flight", (("state", "reserved"),))] == 1
    assert samples[("relier_tasks_in_flight", (("state", "recovering"),))] == 1
    assert samples[("relier_tasks_overdue", ())] == 1
    assert samples[("relier_recovery_queue_depth", ())] == 0

    # No worker consumes the recovery queue: the resurrected message waits there.
    assert Resurrector(app, cfg, "figures").run_pass().outcomes == {"resurrected": 1}

    after = metrics.read()
    assert after.live.by_state == {
        "queued": 1, "reserved": 1, "running": 0, "scheduled": 0, "recovering": 0,
    }  # fmt: skip
    assert after.live.overdue == 0
    assert after.recovery_queue_depth == 1 == client.llen(cfg.recovery_queue)
    assert after.resurrections["pool_death"] == 1
    samples = _samples(after)
    assert samples[("relier_tasks_in_flight", (("state", "recovering"),))] == 0
    assert samples[("relier_tasks_overdue", ())] == 0
    assert samples[("relier_recovery_queue_depth", ())] == 1


def test_the_oldest_queued_wait_is_its_age_on_the_redis_clock(redis_client):
    client = sync_client(config.current())
    around = time.monotonic()
    env = _stored(client, "waiting")
    created_ms = int(client.hget(KEYS.task(env.id), "created_ms"))
    time.sleep(0.2)
    elapsed_ms = _now_ms(client) - created_ms
    found = metrics.read()
    around = time.monotonic() - around

    oldest = found.live.oldest_queued_s
    assert oldest == (found.at_ms - created_ms) / 1000
    # Dates are whole milliseconds on the Redis clock: at most 1 ms more than measured.
    assert elapsed_ms / 1000 <= oldest <= around + 0.001
    assert _samples(found)[("relier_oldest_queued_seconds", ())] == oldest


def test_the_current_minute_holds_its_commit_and_its_dead_letter(redis_client):
    client = sync_client(config.current())
    left_ms = 60_000 - _now_ms(client) % 60_000
    if left_ms < 10_000:  # all of it inside one minute of the Redis clock
        time.sleep(left_ms / 1000 + 0.05)
    minute = _now_ms(client) // 60_000
    env = _started(client, "committed")
    assert fencing.commit(KEYS, env, outcome.succeeded(1, env.fence), 60_000).run(client).accepted
    _dead_lettered("dead-lettered")

    found = metrics.read()
    assert found.at_ms // 60_000 == minute
    assert found.minutes[-1] == Minute(minute * 60, committed=1, dead_lettered=1)
    assert all(m == Minute(m.at_s) for m in found.minutes[:-1])
    assert [(w.name, w.committed, w.dead_lettered) for w in found.windows] == [
        ("1h", 1, 1), ("6h", 1, 1), ("3d", 1, 1),
    ]  # fmt: skip
    samples = _samples(found)
    assert samples[("relier_tasks_committed_total", ())] == 1
    assert samples[("relier_tasks_dead_lettered_total", (("reason", "exception"),))] == 1
    for window in ("1h", "6h", "3d"):
        assert samples[("relier_slo_success_ratio", (("window", window),))] == 0.5
        burn = samples[("relier_slo_error_budget_burn", (("window", window),))]
        assert burn == pytest.approx(0.5 / (1 - 0.999))
