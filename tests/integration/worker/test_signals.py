"""relier's Django signals: each is sent once the store confirmed its act, once per act,
in the process that did it; a receiver (or a core event handler) that raises is logged
and never undoes or breaks the act."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import relier_django
from relier_django import TaskFailed, signals
from relier_django.core.dlq.store import DeadLetterStore
from relier_django.core.model import config, events, limits
from relier_django.core.model.envelope import Envelope, decode
from relier_django.core.model.spec import TaskSpec
from relier_django.core.model.timing import timing
from relier_django.core.push import producer
from relier_django.core.recovery.resurrector import Resurrector
from relier_django.core.schedule.dispatch import Dispatcher
from relier_django.core.store import cancel as core_cancel
from relier_django.core.store import scripts
from relier_django.core.store.cancel import Cancelled
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from relier_django.core.worker import fencing
from relier_django.core.worker.runner import Runner
from relier_django.dlq import release_entry
from testproject.celery import app
from testproject.demo import tasks
from testproject.lostreply import LostReplyProxy, config_through

KEYS = KeySpace("rl")
ALL = (
    signals.task_dead_lettered,
    signals.task_resurrected,
    signals.task_released,
    signals.task_cancelled,
    signals.task_parked,
    signals.task_unparked,
)


@pytest.fixture
def received() -> Iterator[list[tuple[Any, dict[str, Any]]]]:
    """Every signal this process sends during the test: (signal, keyword arguments)."""
    got: list[tuple[Any, dict[str, Any]]] = []

    def record(signal: Any, sender: Any, **kwargs: Any) -> None:
        got.append((signal, kwargs))

    for signal in ALL:
        signal.connect(record, weak=False, dispatch_uid="test_signals.record")
    try:
        yield got
    finally:
        for signal in ALL:
            signal.disconnect(dispatch_uid="test_signals.record")


def fails(label: str) -> None:
    raise ValueError(f"cannot process {label}")


FAILS = TaskSpec(name="t.fails", fn=fails, queue="signals")
WAITS = TaskSpec(name="t.waits", fn=lambda label: label, queue="signals")


def _pushed(spec: TaskSpec, label: str) -> Envelope:
    receipt = producer.push(spec, app, (label,), {}, on_commit=False)
    stored = sync_client(config.current()).hget(KEYS.task(receipt.task_id), "env")
    return decode(stored)


def _dead_lettered_in_process(label: str) -> Envelope:
    env = _pushed(FAILS, label)
    Runner(FAILS, app, config.current(), "test:1").run_blocking(env.encode())
    return env


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_task_failing_on_a_worker_sends_task_dead_lettered_in_that_worker_once(
    worker_factory, redis_client, tmp_path
):
    log = tmp_path / "signals.jsonl"
    worker_factory(extra_env={"DEMO_SIGNAL_LOG": str(log)})
    receipt = tasks.explode.push("sig-dead")
    with pytest.raises(TaskFailed):
        receipt.get(timeout=30)

    deadline = time.monotonic() + 10  # the receiver runs just after the script's reply
    while not _lines(log) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # and nothing more comes
    (line,) = _lines(log)
    assert line["signal"] == "task_dead_lettered"
    assert line["pid"] != os.getpid()  # sent in the worker, where the failure was filed
    assert {k: line[k] for k in ("task_id", "task", "fence", "reason", "queue", "entry_id")} == {
        "task_id": receipt.task_id, "task": "demo.explode", "fence": 1, "reason": "exception",
        "queue": "", "entry_id": receipt.task_id,
    }  # fmt: skip
    assert line["error"] == "ValueError: cannot process sig-dead"


def test_a_dead_letter_sends_task_dead_lettered_with_the_entry(redis_client, received):
    env = _dead_lettered_in_process("in-process")
    ((signal, kwargs),) = received
    assert signal is signals.task_dead_lettered
    assert kwargs["event"] == events.TaskDeadLettered(
        env.id, "t.fails", 1, "exception", "ValueError: cannot process in-process", "signals",
        env.id,
    )  # fmt: skip
    assert DeadLetterStore(sync_client(config.current()), KEYS).get(env.id) is not None


def test_a_release_sends_task_released(redis_client, received):
    env = _dead_lettered_in_process("to-release")
    received.clear()
    receipt = release_entry(env.id)
    ((signal, kwargs),) = received
    assert signal is signals.task_released
    assert kwargs["event"] == events.TaskReleased(
        env.id, "t.fails", 2, env.id, "exception", "signals"
    )
    assert receipt.task_id == env.id
    assert DeadLetterStore(sync_client(config.current()), KEYS).get(env.id) is None


def test_a_cancel_sends_task_cancelled_once_and_a_second_cancel_sends_nothing(
    redis_client, received
):
    queued = _pushed(WAITS, "queued")
    assert relier_django.cancel(queued.id) is Cancelled.BEFORE_START
    running = _pushed(WAITS, "running")
    client = sync_client(config.current())
    assert fencing.start(KEYS, running, "test:1", 60_000).run(client).started
    assert relier_django.cancel(running.id) is Cancelled.WHILE_RUNNING
    assert relier_django.cancel(queued.id) is Cancelled.NOTHING  # finished: no act, no signal

    assert [(s, k["event"]) for s, k in received] == [
        (signals.task_cancelled, events.TaskCancelled(queued.id, False, "t.waits", "signals")),
        (signals.task_cancelled, events.TaskCancelled(running.id, True, "t.waits", "signals")),
    ]
    assert received[1][1]["running"] is True


def test_a_cancel_whose_reply_was_lost_is_told_once(
    lost_reply: LostReplyProxy, received
):  # fmt: skip
    env = _pushed(WAITS, "lost")
    with config_through(lost_reply) as cfg:
        lost_reply.drop_reply(scripts.CANCEL.sha)
        assert core_cancel.cancel(cfg, env.id) is Cancelled.BEFORE_START
    assert lost_reply.dropped == 1  # the client replayed the call
    assert [k["event"] for _, k in received] == [
        events.TaskCancelled(env.id, False, "t.waits", "signals")
    ]


def test_a_resurrection_sends_task_resurrected(redis_client, received):
    env = _pushed(WAITS, "expired")
    client = sync_client(config.current())
    seconds, _ = client.time()  # its heartbeat (here: its queued grace) ran out
    client.zadd(KEYS.expiry, {env.id: (int(seconds) - 60) * 1000})
    cfg = config.current()

    assert Resurrector(app, cfg, "signals").run_pass().resurrected == 1

    ((signal, kwargs),) = received
    assert signal is signals.task_resurrected
    assert kwargs["event"] == events.TaskResurrected(
        env.id, "t.waits", 2, 1, cfg.recovery_queue, "unsent"
    )
    assert kwargs["cause"] == "unsent"  # its message never reached a worker


ONE_SLOT = TaskSpec(
    name="t.one_slot", fn=lambda label: label, queue="signals",
    limits=limits.check_options(1, None, None, None),
)  # fmt: skip


def test_parking_sends_task_parked_and_the_dispatch_after_a_hand_over_task_unparked(
    redis_client, received
):
    """One slot: the first push holds it, the second parks at its push (told by the
    pushing process), a countdown push parks at the leader's dispatch (told by the
    leader); the holder's commit hands the slot to the first parked task, which the
    leader's next dispatch tells as unparked with its wait. Each act told once."""
    cfg = config.current()
    dispatcher = Dispatcher(app, cfg, "scanner-1")
    holder = _pushed(ONE_SLOT, "holder")
    parked = _pushed(ONE_SLOT, "parked")
    late = producer.push(ONE_SLOT, app, ("late",), {}, on_commit=False, when=timing(0.05))
    time.sleep(0.1)
    assert dispatcher.run_due() == 1  # the holder; the countdown push parks
    scope = "t:t.one_slot"
    assert [(sig, kw["event"]) for sig, kw in received] == [
        (signals.task_parked, events.TaskParked(parked.id, "t.one_slot", scope, "")),
        (signals.task_parked, events.TaskParked(late.task_id, "t.one_slot", scope, "")),
    ]
    received.clear()
    Runner(ONE_SLOT, app, cfg, "test:1").run_blocking(holder.encode())  # commits: hands over
    assert dispatcher.run_due() == 1
    ((signal, kwargs),) = received
    assert signal is signals.task_unparked
    assert (kwargs["task_id"], kwargs["task"], kwargs["queue"]) == (parked.id, "t.one_slot",
                                                                   "signals")  # fmt: skip
    assert 0 <= kwargs["waited_s"] < 30
    assert redis_client.hget(KEYS.task(parked.id), "parked_ms") is None  # told once


def test_a_receiver_that_raises_breaks_neither_the_act_nor_the_other_receivers(
    redis_client, received, caplog
):
    def broken(**kwargs: Any) -> None:
        raise RuntimeError("the alerting hook is down")

    for signal in ALL:
        signal.connect(broken, weak=False, dispatch_uid="test_signals.broken")
    try:
        with caplog.at_level(logging.ERROR, logger="django.dispatch"):
            env = _dead_lettered_in_process("hook-down")
            receipt = release_entry(env.id)
            assert relier_django.cancel(receipt.task_id) is Cancelled.BEFORE_START
    finally:
        for signal in ALL:
            signal.disconnect(dispatch_uid="test_signals.broken")
    assert [s for s, _ in received] == [
        signals.task_dead_lettered, signals.task_released, signals.task_cancelled,
    ]  # fmt: skip
    failures = [r for r in caplog.records if r.name == "django.dispatch"]
    assert len(failures) == 3 and all(r.exc_info for r in failures)


def test_a_core_handler_that_raises_is_logged_and_the_act_stands(redis_client, caplog):
    def broken(event: events.Event) -> None:
        raise RuntimeError("handler bug")

    events.subscribe(broken)
    try:
        with caplog.at_level(logging.ERROR, logger="relier_django.events"):
            env = _dead_lettered_in_process("core-handler")
    finally:
        assert events.unsubscribe(broken)
    assert DeadLetterStore(sync_client(config.current()), KEYS).get(env.id) is not None
    (record,) = [r for r in caplog.records if r.name == "relier_django.events"]
    assert record.exc_info and "TaskDeadLettered" in record.getMessage()
    assert env.id in record.getMessage()
