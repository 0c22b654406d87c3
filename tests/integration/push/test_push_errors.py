"""What a push refuses and how it fails, as a user meets it (docs/api.md, "What a push
raises"): arguments too large for the store, a caller-chosen task id that breaks the
id rule, Redis down outside a transaction, and ``replay()`` from a fresh ``manage.py
shell``. Real Redis, real processes."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
import time
from typing import Any

import pytest
import redis
from celery import chain, group
from kombu.exceptions import OperationalError

from relier_django import ArgumentsTooLarge, InvalidTaskId, PushFailed, RelierError, conf
from relier_django.core.model.config import Config
from relier_django.core.push import producer
from relier_django.core.store import connection
from relier_django.core.store.retrying import BoundedRetry
from relier_django.transactions import replay
from testproject.celery import app
from testproject.demo import tasks
from testproject.harness import REPO_ROOT, free_port, worker_env


def test_an_argument_above_the_limit_is_refused_naming_it_and_the_setting(redis_client, settings):
    settings.RELIER = {**settings.RELIER, "ARGUMENTS_MAX_BYTES": 10_000}
    before = redis_client.dbsize()
    with pytest.raises(ArgumentsTooLarge) as refused:
        tasks.record.push(sleep_s=0, label="x" * 20_000)
    message = str(refused.value)
    assert "kwargs['label'] (20002 bytes)" in message and "ARGUMENTS_MAX_BYTES (10000)" in message
    assert "pass its id" in message and isinstance(refused.value, ValueError)
    assert redis_client.dbsize() == before  # refused before anything was stored
    # A non-ASCII argument is measured in bytes, as Redis stores it.
    with pytest.raises(ArgumentsTooLarge, match=r"args\[0\] \(15002 bytes\)"):
        tasks.record.push("é" * 7500, 0)
    assert tasks.record.push("x" * 9_000, 0).task_id  # within the limit: stored


def test_the_default_limit_refuses_ten_megabytes_and_takes_half_a_megabyte(redis_client):
    with pytest.raises(
        ArgumentsTooLarge, match=r"ARGUMENTS_MAX_BYTES \(1048576\); the largest is args\[0\]"
    ):
        tasks.record.push("x" * 10_000_000, 0)
    assert tasks.record.push("x" * 500_000, 0).task_id  # stored: no worker needed


BAD_IDS = {
    "newline": "order-1\nINFO forged log line",
    "nul": "order-1\x00",
    "space": "order 1",
    "tab": "order\t1",
    "bidi override": "order-\u202e1",
    "empty": "",
    "65 characters": "x" * 65,
}


def _pushes_with(bad: str) -> dict[str, object]:
    """Every door through which a caller can choose an id, each given ``bad``."""
    add, rec = tasks.step_add, tasks.record
    return {
        "apply_async(task_id=)": lambda: rec.apply_async(("x", 0), task_id=bad),
        "producer.push(task_id=)": lambda: producer.push(
            rec.relier_spec, app, ("x", 0), {}, task_id=bad, on_commit=False
        ),
        "a signature's frozen id": lambda: rec.s("x", 0).set(task_id=bad).apply_async(),
        "a chain step's frozen id": lambda: chain(
            add.s(1, 2), add.s(3).set(task_id=bad)
        ).apply_async(),
        # A group is one push per member (docs/workflows.md): a member after this one
        # would find its predecessors pushed, as for a member refused for its arguments.
        "a group member's frozen id": lambda: group(
            [add.s(3, 4).set(task_id=bad), add.s(1, 2)]
        ).apply_async(),
        "a group's id": lambda: group([add.s(1, 2)]).apply_async(task_id=bad),
        "replay() of an envelope": lambda: replay(
            dataclasses.replace(producer.prepare(rec.relier_spec, ("x", 0), {}), id=bad).encode()
        ),
    }


@pytest.mark.parametrize("kind", sorted(BAD_IDS))
def test_a_bad_caller_chosen_id_is_refused_at_every_door_naming_the_rule_and_stores_nothing(
    kind, redis_client
):
    bad = BAD_IDS[kind]
    for door, push in _pushes_with(bad).items():
        with pytest.raises(InvalidTaskId) as refused:
            push()
        message = str(refused.value)
        assert repr(bad) in message, door  # shown as its repr: a newline reads as \n
        assert "1 to 64 printable characters with no whitespace" in message, door
        assert isinstance(refused.value, ValueError) and refused.value.task_id == bad, door
        assert redis_client.dbsize() == 0, door  # refused before anything was stored


def test_a_caller_chosen_id_of_64_printable_characters_is_stored_under_it(redis_client):
    chosen = "shop/order:42@eu-west#retry?é%" + "x" * 34
    assert len(chosen) == 64
    receipt = tasks.record.apply_async(("x", 0), task_id=chosen)
    assert receipt.task_id == chosen and redis_client.exists(f"rl:t:{{{chosen}}}")
    with pytest.raises(TypeError, match="task_id must be a str"):
        tasks.record.apply_async(("x", 0), task_id=42)


def test_redis_down_outside_a_transaction_raises_push_failed(redis_server, redis_down):
    with pytest.raises(PushFailed) as failed:
        tasks.record.push_with(on_commit=False).push("nowhere", 0)
    # Celery code catches kombu's OperationalError (what apply_async raises): still caught.
    assert isinstance(failed.value, OperationalError) and isinstance(failed.value, RelierError)
    assert "was not stored" in str(failed.value) and "HTTP 503" in str(failed.value)
    assert failed.value.__cause__ is not None  # the client's own error, kept


def _push_failing_at(url: str, monkeypatch: pytest.MonkeyPatch, wait_s: float) -> PushFailed:
    with monkeypatch.context() as env:
        env.setenv("RELIER_REDIS_URL", url)
        env.setenv("RELIER_PUSH_WAIT_S", str(wait_s))
        conf.clear_cache()
        try:
            with pytest.raises(PushFailed) as failed:
                tasks.record.push_with(on_commit=False).push("nowhere", 0)
        finally:
            conf.clear_cache()
    return failed.value


def test_a_push_waits_for_a_refusing_redis_within_push_wait_s(redis_server, monkeypatch):
    attempts: list[float] = []
    connect = redis.connection.Connection._connect

    def counted(self: Any) -> Any:
        attempts.append(self.socket_connect_timeout)
        return connect(self)

    monkeypatch.setattr(redis.connection.Connection, "_connect", counted)
    url = f"redis://127.0.0.1:{free_port()}/0"
    _push_failing_at(url, monkeypatch, wait_s=0.4)
    # Retried within the budget (a refusal is instant: the backoff spends it), each
    # connect bounded by the budget, not the 5 s socket timeout workers keep.
    assert attempts and set(attempts) == {0.4}
    budgeted = connection.sync_client(dataclasses.replace(Config(), redis_url=url), wait_s=0.4)
    retry = budgeted.connection_pool.connection_kwargs["retry"]
    assert isinstance(retry, BoundedRetry) and retry.budget_s == 0.4


def test_a_push_to_a_redis_that_never_answers_fails_within_its_budget(redis_server, monkeypatch):
    # A server that accepts connections and never replies (a hung or blackholed
    # Redis): before PUSH_WAIT_S, each attempt waited the 5 s socket timeout and the
    # client retried for REDIS_RETRY_S, over 90 s in all (measured). Now one attempt
    # spends the budget. The bound below is ten budgets, generous on purpose on a
    # shared machine: it only tells "one budget" from "minutes".
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    try:
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        started = time.monotonic()
        failed = _push_failing_at(url, monkeypatch, 0.3)
        waited = time.monotonic() - started
    finally:
        silent.close()
    assert isinstance(failed.__cause__, redis.exceptions.TimeoutError)
    assert waited < 10 * 0.3


def test_replay_from_a_fresh_shell_finds_the_task_without_importing_it(redis_server, redis_client):
    env = producer.prepare(tasks.record.relier_spec, ("from-the-log", 0), {})
    code = (
        "import sys; from relier_django.transactions import replay; "
        "print(replay(sys.stdin.read()).task_id)"
    )
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        input=env.encode(), capture_output=True, text=True, cwd=REPO_ROOT,
        env=worker_env(redis_server.url), timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == env.id
    assert redis_client.exists(f"rl:t:{{{env.id}}}")  # stored and queued, under its own id


def test_info_stays_quiet_in_the_normal_course_of_a_task(worker_factory, relier_log, redis_client):
    """docs/observability.md, "Loggers": per-task lines are DEBUG, INFO is for operators."""
    relier_log.set_level("INFO", logger="relier_django")
    first = tasks.charge.push("order-1", 100)
    assert tasks.charge.push("order-1", 100).duplicate_of == first.task_id  # idempotent
    assert not [r for r in relier_log.records if r.name.startswith("relier_django.producer")]
    # A worker at the level a project sets (INFO, the testproject's own DEBUG undone).
    worker = worker_factory(extra_env={"TESTPROJECT_RUNNER_LOG_LEVEL": "INFO"})
    first.get(timeout=30)
    log = worker.log_text()
    assert f"{first.task_id}] succeeded" in log  # Celery's own line, for contrast
    assert "committed task_id=" not in log
