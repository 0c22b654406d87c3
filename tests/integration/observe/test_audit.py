"""The delivery audit (``manage.py relier_audit``, issue 40) against a real worker:
every push is explained (committed, dead-lettered with its reason, cancelled, in flight
within its bound), and a task whose keys an operator deleted by hand is the one
unexplained id."""

from __future__ import annotations

import io
import json
import time

import pytest
from django.core.management import call_command

from chaos.evidence import Evidence, read_audit
from chaos.invariants import check
from relier_django import TaskFailed, cancel
from relier_django.core.model import config
from relier_django.core.observe.audit import audit, now
from relier_django.core.push import idempotency, producer
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from testproject.demo import tasks

pytestmark = pytest.mark.integration


def _audit(*args: str) -> str:
    out = io.StringIO()
    call_command("relier_audit", *args, stdout=out)
    return out.getvalue()


def _until(predicate, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_every_push_is_explained_and_a_hand_deleted_task_is_the_one_unexplained(
    worker, redis_client
):
    keys = KeySpace.of(config.current())
    done = [tasks.record.push(f"ok{i}") for i in range(3)]
    failed = tasks.explode.push("boom")
    running = tasks.work.push("long", 60)
    waiting = tasks.record.push_with(countdown=3600).push("later")
    called_off = tasks.record.push_with(countdown=3600).push("called-off")
    lost = tasks.record.push_with(countdown=3600).push("lost")
    for receipt in done:
        receipt.get(timeout=30)
    with pytest.raises(TaskFailed):
        failed.get(timeout=30)
    cancel(called_off.task_id)
    _until(lambda: redis_client.hget(keys.task(running.task_id), "state") == b"running")
    # An operator (or a bug) deletes a task's hash: the store no longer knows it.
    assert redis_client.delete(keys.task(lost.task_id)) == 1

    found = audit(redis_client, keys, now(redis_client) - 600_000, slack_ms=3000)
    assert found.noted == 8
    assert found.classes == {
        "committed": 3, "dead_lettered": 1, "cancelled": 1, "in_flight": 2,
    }  # fmt: skip
    assert found.dead_lettered_by_reason == {"exception": 1}
    assert found.in_flight_by_state == {"running": 1, "scheduled": 1}
    assert found.unexplained == 1
    assert [(u.task_id, u.why) for u in found.unexplained_ids] == [(lost.task_id, "gone")]
    assert waiting.task_id not in {u.task_id for u in found.unexplained_ids}

    text = _audit("--since", "10m")
    assert "unexplained: 1" in text
    assert f"  {lost.task_id}  gone" in text
    shown = json.loads(_audit("--since", "10m", "--json"))
    assert shown == {
        "at_ms": shown["at_ms"], "since_ms": shown["since_ms"],
        "horizon_s": config.current().audit_horizon_ms / 1000, "ledger": True,
        "noted": 8, "committed": 3, "dead_lettered": 1, "cancelled": 1, "in_flight": 2,
        "dead_lettered_by_reason": {"exception": 1},
        "in_flight_by_state": {"running": 1, "scheduled": 1}, "unexplained": 1,
        "unexplained_ids": [
            {"task_id": lost.task_id, "noted_ms": shown["unexplained_ids"][0]["noted_ms"],
             "why": "gone"},
        ],
    }  # fmt: skip
    assert shown["since_ms"] <= shown["unexplained_ids"][0]["noted_ms"] <= shown["at_ms"]
    with pytest.raises(SystemExit) as exit_:
        _audit("--since", "10m", "--check")
    assert exit_.value.code == 1


def test_the_chaos_evidence_ends_with_the_audit_and_a_deleted_result_is_one_unexplained_id(
    worker, redis_client
):
    """The chaos runner's last check (chaos/evidence.py read_audit): after a drain every
    push is explained; an outcome record deleted by hand is exactly one unexplained id."""
    keys = KeySpace.of(config.current())
    receipts = [tasks.record.push(f"drained{i}") for i in range(5)]
    for receipt in receipts:
        receipt.get(timeout=30)
    client = sync_client(config.current())
    found = read_audit(client)
    assert (found.noted, found.classes, found.unexplained) == (5, {"committed": 5}, 0)
    redis_client.delete(keys.result(receipts[2].task_id))
    found = read_audit(client)
    assert found.unexplained == 1
    assert [u.task_id for u in found.unexplained_ids] == [receipts[2].task_id]
    (audit_check,) = [c for c in check(Evidence(pushed={}, audit=found)) if "audit" in c.name]
    assert not audit_check.ok and receipts[2].task_id in audit_check.detail


def test_a_task_past_its_deadline_is_overdue_and_one_no_index_holds_is_unindexed(redis_client):
    keys = KeySpace.of(config.current())
    overdue = tasks.record.push("stuck")  # no worker: it waits, queued
    unindexed = tasks.record.push("unindexed")
    client = sync_client(config.current())
    # Its deadline long past (as if no scanner ran), and another's index entry gone.
    client.zadd(keys.expiry, {overdue.task_id: now(client) - 60_000})
    client.zrem(keys.expiry, unindexed.task_id)
    found = audit(client, keys, now(client) - 60_000, slack_ms=3000)
    assert sorted((u.task_id, u.why) for u in found.unexplained_ids) == sorted(
        [(overdue.task_id, "overdue"), (unindexed.task_id, "unindexed")]
    )
    assert _audit("--since", "1m").splitlines()[-3] == "unexplained: 2"


def test_the_ledger_is_trimmed_to_its_horizon_and_expires(redis_client):
    keys = KeySpace.of(config.current())
    tasks.record.push("noted")
    assert redis_client.xlen(keys.ledger) == 1
    ttl = redis_client.pttl(keys.ledger)
    assert 0 < ttl <= config.current().audit_horizon_ms


def test_off_the_ledger_notes_nothing(redis_client, settings):
    settings.RELIER = {**getattr(settings, "RELIER", {}), "AUDIT_HORIZON_S": 0}
    tasks.record.push("unnoted")
    assert not any(k.endswith(b":ledger") for k in redis_client.keys("*"))
    assert "ledger is off" in _audit()


def test_a_horizon_longer_than_the_results_is_refused():
    with pytest.raises(Exception, match="audit_horizon_s"):
        config.Config(result_ttl_s=60, audit_horizon_s=120)


def test_a_partitioned_store_keeps_a_ledger_per_partition_and_the_audit_reads_them_all(
    redis_client,
):
    keys = KeySpace("rl", True, 4, True, ledger_ms=60_000)
    ids = []
    for i in range(12):
        env = producer.prepare(tasks.record.relier_spec, (f"p{i}",), {}, f"part-{i}")
        assert idempotency.store(keys, env, env.encode(), 60_000, 3).run(redis_client).stored
        ids.append(env.id)
    ledgers = {part.ledger for part in keys.parts() if redis_client.exists(part.ledger)}
    assert len(ledgers) > 1  # the ids spread over partitions, each noted in its own
    redis_client.delete(keys.task(ids[5]))
    found = audit(redis_client, keys, now(redis_client) - 60_000, slack_ms=3000)
    assert (found.noted, found.in_flight_by_state) == (12, {"queued": 11})
    assert [(u.task_id, u.why) for u in found.unexplained_ids] == [(ids[5], "gone")]


def test_since_takes_a_duration_and_names_the_form_it_wants(redis_client):
    from django.core.management.base import CommandError

    from relier_django.management.commands.relier_audit import parse_since

    assert [parse_since(t) for t in ("90s", "15m", "24h", "2d", "30")] == [
        90, 900, 86400, 172800, 30,
    ]  # fmt: skip
    with pytest.raises(CommandError, match="such as 90s, 15m, 24h or 2d"):
        _audit("--since", "yesterday")
