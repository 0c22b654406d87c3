"""G11: durable countdown, eta and expiry. A delayed task waits in Redis (the schedule
index), in no worker's memory and no broker queue, and the scanner leader dispatches it
when due on the Redis clock, once; retries with a backoff wait there too."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from relier_django import TaskFailed
from relier_django.core.model import config
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from testproject.demo import tasks
from testproject.harness import wait_until

KEYS = KeySpace("rl")
# A long scan interval: a task due in a second that runs well before the next pass was
# dispatched by the leader's sleep-until-due, not found by a periodic scan.
SLOW_SCAN = {"RELIER_SCAN_INTERVAL_S": "6"}


def _redis_now_ms(client) -> int:  # type: ignore[no-untyped-def]
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def runs(client, label: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [r.decode() for r in client.lrange(f"demo:exec:{label}", 0, -1)]


def test_a_countdown_push_waits_in_redis_not_in_a_queue(redis_client):
    receipt = tasks.sync_record.push_with(countdown=60).push("later")
    task = redis_client.hgetall(KEYS.task(receipt.task_id))
    assert task[b"state"] == b"scheduled"
    due = redis_client.zscore(KEYS.schedule, receipt.task_id)
    assert 59_000 <= due - _redis_now_ms(redis_client) <= 60_000
    assert redis_client.llen("celery") == 0  # no message anywhere: nothing to redeliver
    assert redis_client.zscore(KEYS.expiry, receipt.task_id) is None


def test_a_scheduled_task_runs_once_at_its_time_never_before(worker_factory, redis_client):
    worker_factory(extra_env=SLOW_SCAN)
    time.sleep(1)  # the worker's scanner leads and sleeps until the next due time
    pushed_at = _redis_now_ms(redis_client)
    receipt = tasks.sync_record.push_with(countdown=1.5).push("due-soon")
    due_ms = int(redis_client.zscore(KEYS.schedule, receipt.task_id))
    result = receipt.get(timeout=30)
    ran = runs(redis_client, "due-soon")
    assert len(ran) == 1 and result["fence"] == 1
    assert due_ms - pushed_at >= 1_400
    assert _redis_now_ms(redis_client) - pushed_at < 6_000  # well before the next pass


def test_the_task_sees_when_it_was_due(worker, redis_client):
    eta = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
    receipt = tasks.scheduled_at.push_with(eta=eta).push("when")
    seen = receipt.get(timeout=30)
    assert abs(dt.datetime.fromisoformat(seen) - eta) < dt.timedelta(milliseconds=5)
    assert tasks.scheduled_at.push("now").get(timeout=30) is None


def test_an_eta_in_the_past_dispatches_at_once(worker, redis_client):
    past = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    receipt = tasks.sync_record.push_with(eta=past).push("past")
    assert redis_client.zscore(KEYS.schedule, receipt.task_id) is None
    assert receipt.get(timeout=30)["label"] == "past"


def test_a_naive_datetime_is_refused_and_nothing_is_stored(redis_client):
    with pytest.raises(TypeError, match=r"naive datetime.*timezone-aware"):
        tasks.sync_record.push_with(eta=dt.datetime(2030, 1, 1)).push("naive")
    with pytest.raises(ValueError, match="countdown= must be a finite number"):
        tasks.sync_record.push_with(countdown=-1).push("negative")
    assert redis_client.dbsize() == 0


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("countdown", 1e12),  # 31,700 years
        ("countdown", dt.timedelta.max),
        ("eta", dt.datetime(9999, 12, 31, 12, tzinfo=dt.UTC)),
        ("eta", dt.datetime(9999, 12, 31, 23, tzinfo=dt.timezone(dt.timedelta(hours=-5)))),
        ("eta", dt.datetime(1, 1, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=14)))),
        ("expires", 1e12),
        ("expires", dt.datetime(9999, 12, 31, 1, tzinfo=dt.UTC)),
    ],
)
def test_a_countdown_eta_or_expiry_outside_years_1_to_9999_is_refused_at_push_naming_the_bound(
    option, value, redis_client
):
    bound = r"must fall between 0001-01-02T00:00:00Z and 9999-12-31T00:00:00Z \(UTC\)"
    with pytest.raises(ValueError, match=rf"{option}=.*{bound}"):
        tasks.sync_record.push_with(on_commit=False, **{option: value}).push("far")
    with pytest.raises(ValueError, match=bound):  # Celery's names too
        tasks.sync_record.apply_async(("far",), **{option: value})
    assert redis_client.dbsize() == 0
    # The last day before the bound is still a time relier schedules.
    tasks.sync_record.push_with(
        on_commit=False, eta=dt.datetime(9999, 12, 30, 23, 59, tzinfo=dt.UTC)
    ).push("latest")
    assert redis_client.zcard(KEYS.schedule) == 1


def test_a_task_not_started_before_it_expires_lands_in_the_dlq_and_never_runs(worker, redis_client):
    receipt = tasks.sync_record.push_with(countdown=1, expires=0.5).push("too-late")
    with pytest.raises(TaskFailed) as failed:
        receipt.get(timeout=30)
    assert failed.value.reason == "expired"
    assert runs(redis_client, "too-late") == []


def test_an_expired_message_reaching_a_worker_is_filed_not_run(worker_factory, redis_client):
    receipt = tasks.sync_record.push_with(expires=0.2).push("stale-message")
    time.sleep(0.5)  # no worker yet: the message waits in the queue past its expiry
    worker_factory()
    with pytest.raises(TaskFailed) as failed:
        receipt.get(timeout=30)
    assert failed.value.reason == "expired"
    assert runs(redis_client, "stale-message") == []


def test_apply_async_countdown_is_a_scheduled_push(redis_client):
    receipt = tasks.sync_record.apply_async(("celery-countdown",), countdown=30)
    assert redis_client.hget(KEYS.task(receipt.task_id), "state") == b"scheduled"


def test_a_retry_backoff_waits_in_the_schedule_not_in_a_worker(worker_factory, redis_client):
    worker_factory(extra_env=SLOW_SCAN)
    client = sync_client(config.current())
    receipt = tasks.flaky_later.push("backoff", failures=1)

    def scheduled() -> bool:
        return client.hget(KEYS.task(receipt.task_id), "state") == "scheduled"

    wait_until(scheduled, 30, what="the retry waiting in the schedule index")
    assert client.zscore(KEYS.schedule, receipt.task_id) is not None
    assert receipt.get(timeout=30)["attempt"] == 2


def test_a_scheduled_task_survives_the_death_of_every_worker(worker_factory, redis_client):
    first = worker_factory(name="first")
    receipt = tasks.sync_record.push_with(countdown=2).push("survivor")
    first.kill()  # SIGKILL, the leader among them, before the task is due
    time.sleep(3)  # due now, and no worker at all
    assert redis_client.zscore(KEYS.schedule, receipt.task_id) is not None
    worker_factory(name="second")
    assert receipt.get(timeout=60)["label"] == "survivor"
    assert len(runs(redis_client, "survivor")) == 1


def test_cancel_takes_back_a_scheduled_task_and_its_receipt_says_so(worker, redis_client):
    from relier_django import Cancelled, TaskCancelled, cancel

    receipt = tasks.charge.push_with(countdown=2).push("o-cancel", 5)
    assert cancel(receipt.task_id) is Cancelled.BEFORE_START
    assert receipt.status == "REVOKED"
    with pytest.raises(TaskCancelled):
        receipt.get(timeout=5)
    time.sleep(2.5)  # past its due time: nothing runs
    assert runs(redis_client, "charge:o-cancel") == []
    assert redis_client.zscore(KEYS.schedule, receipt.task_id) is None
    # Its idempotency claim is freed: the same charge can be pushed again, and runs.
    assert tasks.charge.push("o-cancel", 5).get(timeout=30)["order_id"] == "o-cancel"
    assert cancel(receipt.task_id) is Cancelled.NOTHING  # finished long ago: left alone


def test_cancel_fences_off_a_running_task_which_cannot_commit(worker, redis_client):
    receipt = tasks.sync_record.push("running-cancel", sleep_s=2)
    client = sync_client(config.current())
    key = KEYS.task(receipt.task_id)
    wait_until(lambda: client.hget(key, "state") == "running", 30, what="the task running")
    assert receipt.cancel().name == "WHILE_RUNNING"
    time.sleep(3)  # it finishes its sleep and tries to commit: refused
    assert receipt.status == "REVOKED"
    assert "stale commit rejected task_id=" + receipt.task_id in worker.log_text()


@pytest.mark.parametrize(("held_as", "expected"), [("running", 2), ("queued", 1)])
def test_cancel_of_a_task_a_draining_worker_handed_off_says_whether_its_body_may_run(
    redis_client, held_as, expected
):
    """A worker's drain timeout hands a running task off (handoff.lua) while its body
    still runs in the stopping worker: cancel() says it fenced off a run, not that the
    task never started (issue 35). A reserved task handed off never started."""
    from relier_django import Cancelled, cancel
    from relier_django.core.push import producer
    from relier_django.core.worker import fencing

    cfg, client = config.current(), sync_client(config.current())
    env = producer.prepare(tasks.sync_record.relier_spec, ("drained",), {})
    keys = KeySpace.of(cfg)
    producer._Push(cfg, tasks.sync_record.relier_spec, env, env.encode(), keys).store(None).run(
        client
    )
    if held_as == "running":
        assert fencing.start(keys, env, "w1@host:1", 30_000).run(client).started
    assert fencing.handoff(keys, [(env.id, 1)], state=held_as, cause="drain").run(client) == 1
    assert cancel(env.id) is Cancelled(expected)


def test_a_dead_leaders_due_task_is_dispatched_by_another_scanner_within_a_pass(
    worker_factory, redis_client
):
    # A long leader lease: were only the leader to dispatch, the task would wait for it.
    env = {"RELIER_SCAN_INTERVAL_S": "0.5", "RELIER_LEADER_LEASE_S": "60"}
    first, second = (
        worker_factory(name="first", extra_env=env),
        worker_factory(name="second", extra_env=env),
    )
    leader = redis_client.get(KEYS.leader).decode()
    dying = first if leader.startswith(first.hostname) else second
    receipt = tasks.sync_record.push_with(countdown=1).push("orphaned-by-leader")
    dying.kill()  # SIGKILL: its lease stays for a minute
    began = time.monotonic()
    assert receipt.get(timeout=30)["label"] == "orphaned-by-leader"
    assert time.monotonic() - began < 15  # a pass of the other scanner, not the lease
    # Its lease does not outlive it: the other scanner saw its connection go and took it.
    survivor = second if dying is first else first
    assert redis_client.get(KEYS.leader).decode().startswith(survivor.hostname)


def test_of_concurrent_dispatchers_each_due_task_is_taken_and_published_once(
    redis_client, monkeypatch
):
    """The race behind "every scanner dispatches": schedule_take.lua re-checks each task's
    state as it leases it, so two passes over the same due ids publish each task once."""
    import threading

    from relier_django.core.broker import publish
    from relier_django.core.schedule.dispatch import Dispatcher
    from testproject.celery import app

    cfg = config.current()
    ids = [tasks.sync_record.push_with(countdown=60).push(f"race-{i}").task_id for i in range(60)]
    redis_client.zadd(KEYS.schedule, dict.fromkeys(ids, 1))  # all due long ago
    sent: list[str] = []
    lock = threading.Lock()

    def record(app_, env, encoded, *args, **kwargs):  # type: ignore[no-untyped-def]
        with lock:
            sent.append(env.id)

    monkeypatch.setattr(publish, "send", record)
    dispatchers = [Dispatcher(app, cfg, f"scanner-{i}") for i in range(3)]
    threads = [threading.Thread(target=d.run_due) for d in dispatchers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(sent) == sorted(ids)  # every one, none twice
    assert redis_client.zcard(KEYS.schedule) == 0
    states = {redis_client.hget(KEYS.task(i), "state") for i in ids}
    assert states == {b"queued"}


def test_a_cancel_racing_a_start_agrees_with_it(redis_client):
    """cancel.lua against start.lua, from two threads, task after task: a cancel that
    came first ("before start") leaves the start refused; one that came second ("while
    running") found the start made. Never both, never neither."""
    import threading

    from relier_django import Cancelled, cancel
    from relier_django.core.model.envelope import decode
    from relier_django.core.worker import fencing

    client = sync_client(config.current())
    for i in range(40):
        receipt = tasks.sync_record.push_with(countdown=60).push(f"cancel-race-{i}")
        client.hset(KEYS.task(receipt.task_id), "state", "queued")  # as if dispatched
        env = decode(client.hget(KEYS.task(receipt.task_id), "env"))
        got: dict[str, object] = {}

        def starts(env=env, got=got) -> None:  # type: ignore[no-untyped-def]
            got["start"] = fencing.start(KEYS, env, "w:1", 10_000).run(client).started

        def cancels(task_id=receipt.task_id, got=got) -> None:  # type: ignore[no-untyped-def]
            got["cancel"] = cancel(task_id)

        threads = [threading.Thread(target=starts), threading.Thread(target=cancels)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if got["cancel"] is Cancelled.BEFORE_START:
            assert got["start"] is False
        else:
            assert (got["cancel"], got["start"]) == (Cancelled.WHILE_RUNNING, True)
        assert not client.exists(KEYS.task(receipt.task_id))
