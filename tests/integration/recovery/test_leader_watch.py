"""A scanner that does not lead watches the leader's liveness connection alone
(``CLIENT LIST ID``), on a real Redis: it lists nothing while the leader lives, and
when the leader dies it finds it, and what died with it, within the grace.

The holders are raw sockets named and subscribed as ``store/liveness.py`` does, so
that a test can close one as the kernel closes a killed process's."""

from __future__ import annotations

import socket
import time

import redis

from relier_django.core.recovery import deaths
from relier_django.core.store.keys import KeySpace
from relier_django.core.store.liveness import connection_name
from testproject.harness import RedisServer

KEYS = KeySpace("rl")
GRACE_S = 0.5


def _pack(*args: str) -> bytes:
    out = f"*{len(args)}\r\n"
    for arg in args:
        out += f"${len(arg.encode())}\r\n{arg}\r\n"
    return out.encode()


def _hold(server: RedisServer, client: redis.Redis, worker: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(_pack("CLIENT", "SETNAME", connection_name("rl", worker)))
    sock.sendall(_pack("SUBSCRIBE", KEYS.liveness_channel))
    deadline = time.monotonic() + 5
    while not any(c["name"] == connection_name("rl", worker)
                  for c in client.client_list(_type="pubsub")):  # fmt: skip
        assert time.monotonic() < deadline
        time.sleep(0.01)
    client.sadd(KEYS.holders, worker)
    return sock


def _calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def _check_until(d: deaths.Deaths, want: set[str], within_s: float) -> float:
    start, found = time.monotonic(), set[str]()
    while time.monotonic() - start < within_s:
        found |= set(d.check(watch=True))
        if want <= found:
            return time.monotonic() - start
        time.sleep(deaths.CHECK_S)
    raise AssertionError(f"found {found}, wanted {want} within {within_s} s")


def test_a_follower_lists_nothing_while_the_leader_lives_and_finds_it_dead_with_its_pool(
    redis_server, redis_client
):
    leader = _hold(redis_server, redis_client, "scanner:lead@h")
    pool = _hold(redis_server, redis_client, "lead@h:1")
    other = _hold(redis_server, redis_client, "other@h:1")
    redis_client.set(KEYS.leader, "scanner:lead@h", px=60_000)
    follower = deaths.Deaths(redis_server.client(decode_responses=True), KEYS, grace_s=GRACE_S)
    assert follower.check(watch=True) == {}  # a first list: learns the leader's connection

    redis_client.config_resetstat()
    for _ in range(2 * deaths.LEADER_READ_EVERY):
        assert follower.check(watch=True) == {}
    calls = _calls(redis_client)
    # A list of every connection comes with the holders' SMEMBERS: none was sent.
    assert "smembers" not in calls
    assert calls["client|list"] == 2 * deaths.LEADER_READ_EVERY
    assert calls["get"] == 2  # who leads, re-read once every LEADER_READ_EVERY checks

    leader.close()  # the leader's worker killed: its scanner and its pool process
    pool.close()
    took = _check_until(follower, {"scanner:lead@h", "lead@h:1"}, GRACE_S + 2.0)
    assert took >= GRACE_S  # a reconnect's grace is kept
    other.close()


def test_a_leader_that_reconnects_under_a_new_id_is_not_dead(redis_server, redis_client):
    leader = _hold(redis_server, redis_client, "scanner:lead@h")
    redis_client.set(KEYS.leader, "scanner:lead@h", px=60_000)
    follower = deaths.Deaths(redis_server.client(decode_responses=True), KEYS, grace_s=GRACE_S)
    assert follower.check(watch=True) == {}
    leader.close()
    leader = _hold(redis_server, redis_client, "scanner:lead@h")  # back, under a new id
    for _ in range(int(3 * GRACE_S / deaths.CHECK_S)):
        assert follower.check(watch=True) == {}
        time.sleep(deaths.CHECK_S)
    redis_client.config_resetstat()
    assert follower.check(watch=True) == {}
    assert "smembers" not in _calls(redis_client)  # watching again, by its new id
    leader.close()


def test_a_free_lease_makes_a_follower_list_everything(redis_server, redis_client):
    # No leader (a lease that ran out): every scanner lists, as a leader does, so a
    # death is still found while the lease is taken again.
    gone = _hold(redis_server, redis_client, "w@h:1")
    follower = deaths.Deaths(redis_server.client(decode_responses=True), KEYS, grace_s=GRACE_S)
    assert follower.check(watch=True) == {}
    gone.close()
    _check_until(follower, {"w@h:1"}, GRACE_S + 2.0)
