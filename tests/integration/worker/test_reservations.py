"""Reserved-task coverage from a worker's main process ends when a pool process
accepts the message, whatever Celery's own books still say."""

from __future__ import annotations

import time
from types import SimpleNamespace

from celery.worker import state

from relier_django.core.model import config
from relier_django.core.push import idempotency, producer
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from relier_django.core.worker import intake
from relier_django.core.worker.reservations import Reservations, waiting_request_ids
from testproject.demo import tasks

KEYS = KeySpace("rl")


def _stored(client, label: str):  # type: ignore[no-untyped-def]
    env = producer.prepare(tasks.record.relier_spec, (label,), {})
    idempotency.store(KEYS, env, env.encode(), 60_000, 3).run(client)
    return env


def test_a_request_a_pool_process_accepted_is_no_longer_covered(redis_client):
    client = sync_client(config.current())
    waiting_env, accepted_env = _stored(client, "waiting"), _stored(client, "accepted")
    waiting = {waiting_env.id, accepted_env.id}
    reservations = Reservations(config.current(), lambda: set(waiting))
    reservations.add(waiting_env.id, waiting_env.fence)
    reservations.add(accepted_env.id, accepted_env.fence)
    reservations.refresh_once()  # both booked by Celery, both waiting for a process

    # A pool process accepts one; Celery may keep its request for ever (a pool process
    # SIGKILLed around acceptance), but it is no longer the main process's to cover.
    waiting.discard(accepted_env.id)
    reservations.refresh_once()
    assert dict(reservations.held()) == {waiting_env.id: waiting_env.fence}

    before = {i: client.zscore(KEYS.expiry, i) for i in (waiting_env.id, accepted_env.id)}
    time.sleep(0.05)  # let the Redis clock move on
    reservations.refresh_once()
    assert client.zscore(KEYS.expiry, waiting_env.id) > before[waiting_env.id]
    # Its deadline stays where it was: it starts under its own heartbeat, or expires
    # within one TTL and is resurrected.
    assert client.zscore(KEYS.expiry, accepted_env.id) == before[accepted_env.id]


def test_an_id_added_since_the_last_refresh_is_covered_before_celery_books_it(redis_client):
    client = sync_client(config.current())
    env = _stored(client, "just-received")
    # task_received fires before Celery adds the request to its books.
    reservations = Reservations(config.current(), lambda: set())
    reservations.add(env.id, env.fence)
    reservations.refresh_once()
    assert dict(reservations.held()) == {env.id: env.fence}
    reservations.refresh_once()  # still not booked a round later: no longer covered
    assert reservations.held() == []


def test_waiting_request_ids_leave_out_accepted_requests():
    booked = {
        "reserved": SimpleNamespace(id="reserved", time_start=None),
        "accepted": SimpleNamespace(id="accepted", time_start=1795399964.0),
    }
    state.requests.update(booked)
    try:
        assert waiting_request_ids() >= {"reserved"}
        assert "accepted" not in waiting_request_ids()
    finally:
        for task_id in booked:
            state.requests.pop(task_id, None)


def test_a_redelivered_older_incarnation_does_not_take_the_current_ones_coverage(
    redis_client,
):
    client = sync_client(config.current())
    env = _stored(client, "resurrected-then-redelivered")
    client.hincrby(KEYS.task(env.id), "fence", 1)  # resurrected: fence 2 is current
    reservations = Reservations(config.current(), lambda: {env.id})
    reservations.add(env.id, 2)
    reservations.add(env.id, 1)  # the broker's own copy of fence 1 arrives later
    assert dict(reservations.held()) == {env.id: 2}
    reservations.refresh_once()
    reservations.refresh_once()
    assert dict(reservations.held()) == {env.id: 2}  # still covered


def test_a_received_message_has_a_ttl_deadline_as_soon_as_add_returns(redis_client, monkeypatch):
    """Celery may ack the message (a pool process accepted it) right after the
    ``task_received`` signal that calls ``add``; from then on only the task's own
    deadline brings it back if the worker dies, so it must already be short. (A
    process whose channel takes with take.lua is covered as it pops; this one is a
    process that does not: an earlier test in the session may have made it one.)"""
    monkeypatch.setattr(intake, "_takes_here", False)
    client = sync_client(config.current())
    env = _stored(client, "covered-on-receipt")
    graced = client.zscore(KEYS.expiry, env.id)  # the push's queued grace: an hour
    Reservations(config.current(), lambda: {env.id}).add(env.id, env.fence)
    ttl_ms = config.current().heartbeat_ttl_s * 1000
    deadline = client.zscore(KEYS.expiry, env.id)
    assert deadline < graced
    assert deadline <= time.time() * 1000 + ttl_ms + 1000
