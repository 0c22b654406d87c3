"""HMAC-signed envelopes on real workers (G5): a message tampered in the broker or
sent unsigned is dead-lettered with reason ``payload_integrity`` and its raw body and
never runs; key rotation keeps old envelopes running; every path that re-encodes an
envelope (retry, resurrection, DLQ, release) signs it."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json

import pytest

from relier_django import TaskFailed
from relier_django.core.dlq.store import DeadLetterStore
from relier_django.core.model import config
from relier_django.core.model.envelope import canonical
from relier_django.core.model.signing import key_id
from relier_django.core.push import producer
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from relier_django.dlq import release_entry
from testproject.celery import app
from testproject.demo import tasks
from testproject.harness import wait_until

KEYS = KeySpace("rl")
NEW = "new-key-" + "n" * 40  # test keys: long enough, obviously not secret
OLD = "old-key-" + "o" * 40
HELD = "signing.held"  # a queue no worker consumes until the test starts one on it


def sign_with(settings, *keys: str) -> None:
    """This process (the producer, and the operator releasing) signs with ``keys``."""
    settings.RELIER = {**settings.RELIER, "SIGNING_KEYS": list(keys)}
    assert config.current().signing_keys == keys


def start_worker(worker_factory, *keys: str, **kwargs):
    env = {
        "RELIER_SIGNING_KEYS": ",".join(keys),
        # Short, so the stored copy of a refused message comes back quickly.
        "RELIER_HEARTBEAT_TTL_S": "2",
        "RELIER_SCAN_INTERVAL_S": "0.5",
    }
    return worker_factory(extra_env=env, **kwargs)


def runs(client, label: str) -> int:
    return int(client.llen(f"demo:exec:{label}"))


def dead_entries(reason: str) -> list:
    store = DeadLetterStore(sync_client(config.current()), KEYS)
    return [e for e in store.iter() if e.reason == reason]


def forge(envelope: dict, **changes) -> str:
    """What an attacker who can write the broker can do: change fields and recompute
    the plain SHA-256 checksum. The HMAC cannot be recomputed without a key."""
    body = {k: v for k, v in envelope.items() if k not in ("sha256", "hmac")}
    body.update(changes)
    checksum = hashlib.sha256(canonical(body).encode()).hexdigest()
    return canonical({**body, "sha256": checksum, "hmac": envelope["hmac"]})


def tamper_queued_message(client, queue: str, **changes) -> str:
    """Rewrite the envelope inside the first Celery message waiting in ``queue`` (kombu's
    Redis transport: a JSON message whose body is base64 JSON ``[args, kwargs, embed]``)."""
    message = json.loads(client.lindex(queue, 0))
    body = json.loads(base64.b64decode(message["body"]))
    forged = forge(json.loads(body[0][0]), **changes)
    body[0][0] = forged
    message["body"] = base64.b64encode(json.dumps(body).encode()).decode()
    client.lset(queue, 0, json.dumps(message))
    return forged


def test_a_message_tampered_in_the_broker_never_runs_and_the_stored_task_does(
    settings, worker_factory, redis_client
):
    sign_with(settings, NEW)
    receipt = producer.push(
        dataclasses.replace(tasks.record.relier_spec, queue=HELD), app, ("genuine",), {}
    )
    forged = tamper_queued_message(redis_client, HELD, args=["forged"])
    worker = start_worker(worker_factory, NEW, queues=(HELD,))

    entries = wait_until(lambda: dead_entries("payload_integrity"), 30, what="the DLQ entry")
    assert entries[0].data["raw"] == forged  # kept exactly as it arrived
    assert "HMAC does not match" in entries[0].data["exc_message"]
    # The stored copy, written at push, was not touched: it is resurrected and runs.
    assert receipt.get(timeout=30)["label"] == "genuine"
    assert runs(redis_client, "forged") == 0 and runs(redis_client, "genuine") == 1
    for key in (NEW, OLD):
        assert key not in worker.log_text()


def test_an_unsigned_message_is_refused_where_keys_are_configured(worker_factory, redis_client):
    start_worker(worker_factory, NEW)
    # Pushed by a process without SIGNING_KEYS (this one): no HMAC.
    env = producer.prepare(tasks.record.relier_spec, ("unsigned",), {})
    raw = env.encode(config.current().signer)
    assert "hmac" not in raw
    app.send_task("demo.record", args=[raw], serializer="json")

    entries = wait_until(lambda: dead_entries("payload_integrity"), 30, what="the DLQ entry")
    assert entries[0].data["raw"] == raw
    assert "not signed" in entries[0].data["exc_message"]
    assert runs(redis_client, "unsigned") == 0


def test_rotation_an_envelope_signed_with_the_old_key_runs_where_both_are_listed(
    settings, worker_factory, redis_client
):
    start_worker(worker_factory, NEW, OLD)
    sign_with(settings, OLD)  # a producer not yet rotated
    assert tasks.record.push("old-key").get(timeout=30)["label"] == "old-key"

    # Its failure is re-signed by the worker with the newest key...
    redis_client.set("demo:broken:rotated", "1")
    failed = tasks.until_fixed.push("rotated")
    with pytest.raises(TaskFailed):
        failed.get(timeout=30)
    entry = DeadLetterStore(sync_client(config.current()), KEYS).get(failed.task_id)
    assert entry.envelope["hmac"]["kid"] == key_id(NEW)
    # ...so once the old key is retired everywhere, the entry still releases.
    sign_with(settings, NEW)
    redis_client.delete("demo:broken:rotated")
    release_entry(failed.task_id, expected_fence=entry.fence)
    assert failed.get(timeout=30)["runs"] == 2


def test_retries_resurrections_and_releases_are_signed(settings, worker_factory, redis_client):
    start_worker(worker_factory, NEW)
    sign_with(settings, NEW)
    # An unsigned re-encode anywhere on the way would be refused as payload_integrity.
    assert tasks.flaky.push("signed-retries", 2).get(timeout=30)["attempt"] == 3
    resurrected = tasks.fragile.push("signed-resurrection", 1).get(timeout=60)
    assert resurrected["resurrections"] == 1
    assert dead_entries("payload_integrity") == []


def test_a_stored_copy_no_key_can_verify_is_dead_lettered_by_the_resurrector(
    settings, redis_client
):
    """A key removed too early: the stored copy can never run again, so the resurrector
    moves it to the DLQ (with the stored text) instead of re-leasing it every pass, and
    what the task hash knows (its name, its idempotency claim) goes with it."""
    from relier_django.core.recovery.resurrector import Resurrector

    sign_with(settings, OLD)
    receipt = producer.push(
        dataclasses.replace(tasks.charge.relier_spec, queue=HELD), app, ("o-orphan", 5), {}
    )
    stored = redis_client.hget(KEYS.task(receipt.task_id), "env").decode()
    claim = redis_client.hget(KEYS.task(receipt.task_id), "idem").decode()
    assert redis_client.get(claim).decode() == receipt.task_id
    sign_with(settings, NEW)  # OLD removed: nothing can verify the stored copy now
    redis_client.zadd(KEYS.expiry, {receipt.task_id: 0})  # its grace has run out

    report = Resurrector(app, config.current(), "test-scanner").run_pass()

    assert report.outcomes == {"unreadable": 1}
    [entry] = dead_entries("payload_integrity")
    assert entry.data["task_id"] == receipt.task_id
    assert entry.data["raw"] == stored
    assert "cannot be read" in entry.data["exc_message"]
    assert entry.summary.task == tasks.charge.name  # indexed under its task, not ''
    store = DeadLetterStore(sync_client(config.current()), KEYS)
    assert store.counts().by_task == {tasks.charge.name: 1}
    assert not redis_client.exists(KEYS.task(receipt.task_id))
    assert not redis_client.exists(claim)  # a later push of that key runs again
    assert redis_client.zscore(KEYS.expiry, receipt.task_id) is None  # never re-leased
    with pytest.raises(TaskFailed, match="payload_integrity"):
        receipt.get(timeout=5)
