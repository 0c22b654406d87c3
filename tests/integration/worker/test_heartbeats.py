"""The process's heartbeat set: fence-exact removal, so one incarnation never drops
another's coverage (G1), and a lost reply marks only the incarnation it was about."""

from __future__ import annotations

import asyncio

from relier_django.core.model import config
from relier_django.core.push import idempotency, producer
from relier_django.core.store.connection import close_loop_clients, sync_client
from relier_django.core.store.keys import KeySpace
from relier_django.core.worker import fencing
from relier_django.core.worker.heartbeat import Heartbeats
from testproject.demo import tasks

KEYS = KeySpace("rl")


def _running(client, label: str, fence: int):  # type: ignore[no-untyped-def]
    env = producer.prepare(tasks.record.relier_spec, (label,), {})
    idempotency.store(KEYS, env, env.encode(), 60_000, 3).run(client)
    client.hset(KEYS.task(env.id), mapping={"fence": fence, "state": "running"})
    return env


def test_an_older_incarnation_finishing_leaves_the_newer_ones_entry(redis_client):
    async def scenario() -> list[tuple[str, int]]:
        beats = Heartbeats(config.current(), asyncio.get_running_loop())
        beats.add("t", 1, lambda: None)
        beats.add("t", 2, lambda: None)  # retried: fence 2 started in this process
        beats.remove("t", 1)  # fence 1's clean-up runs late
        held = beats.held()
        beats.remove("t", 2)
        return held

    assert asyncio.run(scenario()) == [("t", 2)]


def test_a_lost_reply_about_an_older_fence_spares_the_incarnation_added_meanwhile(
    redis_client,
):
    client = sync_client(config.current())
    env = _running(client, "re-added", fence=2)  # Redis: fence 2 is current
    signalled: list[int] = []

    async def scenario() -> list[tuple[str, int]]:
        beats = Heartbeats(config.current(), asyncio.get_running_loop())
        beats.add(env.id, 2, lambda: signalled.append(2))
        # The refresh's snapshot was taken while fence 1 was still held here.
        beats.held = lambda: [(env.id, 1)]  # type: ignore[method-assign]
        try:
            lost = await beats.refresh_once()
            assert lost == [env.id]  # fence 1 is indeed lost...
            return Heartbeats.held(beats)
        finally:
            await close_loop_clients()

    held = asyncio.run(scenario())
    assert held == [(env.id, 2)]  # ...but fence 2 is still covered, and not signalled
    assert signalled == []
    assert fencing.heartbeat(KEYS, held, 10_000).run(client) == []  # and still current
