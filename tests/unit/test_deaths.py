"""The verdict logic of recovery/deaths.py: who is dead, and when not to say so.

The client is a stub that answers the reads of a check (CLIENT LIST, and INFO server
and the holders when the list changed or every few lists, the leader key; a follower's
CLIENT LIST ID; TIME for the clock) from a script: what is
tested is the bookkeeping, not Redis (the real thing is
tests/chaos/test_process_death.py and tests/integration/recovery/test_leader_watch.py)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from relier_django.core.recovery import deaths
from relier_django.core.store.keys import KeySpace
from relier_django.core.store.liveness import connection_name, worker_of


class _Pipe:
    def __init__(self, server: _Server) -> None:
        self.server = server
        self.ops: list[str] = []

    def info(self, _section: str) -> None:
        self.ops.append("info")

    def client_list(self, _type: str | None = None, client_id: Any = None) -> None:
        self.ops.append("watch" if client_id is not None else "list")

    def smembers(self, _key: str) -> None:
        self.ops.append("smembers")

    def get(self, _key: str) -> None:
        self.ops.append("get")

    def execute(self) -> list[Any]:
        s = self.server
        s.sent.append(tuple(self.ops))
        if "watch" in self.ops:
            s.watched += 1
            if s.before_6_2:
                raise redis.ResponseError("ERR syntax error")
            found = [{"name": connection_name("rl", w), "id": w} for w in s.live if w == s.leader]
            return [found, s.leader][: len(self.ops)]
        if s.cluster_down:
            raise redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down")
        if s.refuse and "list" in self.ops:
            raise redis.ResponseError("NOPERM this user has no permissions to run 'client'")
        s.registered |= s.live  # liveness.hold registers once connected
        replies: dict[str, Any] = {
            "list": [*({"name": connection_name("rl", w), "id": w} for w in s.live),
                     {"name": "other", "id": "0"}],
            "info": {"run_id": s.run_id},
            "smembers": set(s.registered),
            "get": s.leader,
        }  # fmt: skip
        if "list" in self.ops:
            s.listed += 1
        return [replies[op] for op in self.ops]


class _Server:
    def __init__(self) -> None:
        self.live: set[str] = set()
        self.registered: set[str] = set()
        self.run_id = "a"
        self.now_ms = 1_000_000
        self.refuse = False
        self.cluster_down = False
        self.leader: str | None = None
        self.before_6_2 = False
        self.watched = self.listed = 0
        self.sent: list[tuple[str, ...]] = []  # each round trip's commands
        self.times = 0

    def time(self) -> tuple[int, int]:
        self.times += 1
        return (self.now_ms // 1000, (self.now_ms % 1000) * 1000)

    def pipeline(self, transaction: bool = False) -> _Pipe:
        return _Pipe(self)


@pytest.fixture
def clock(monkeypatch):  # type: ignore[no-untyped-def]
    now = [100.0]
    monkeypatch.setattr(deaths.time, "monotonic", lambda: now[0])
    return now


def _step(d: deaths.Deaths, server: _Server, clock: list[float], s: float) -> dict[str, int]:
    clock[0] += s
    server.now_ms += int(s * 1000)
    return d.check()


def test_names_are_read_back_only_for_this_prefix():
    assert worker_of("rl", connection_name("rl", "w1@h:7")) == "w1@h:7"
    assert worker_of("rl", connection_name("other", "w1@h:7")) is None
    assert worker_of("rl", "relier:7") is None and worker_of("rl", "") is None


def test_a_holder_seen_then_absent_for_the_grace_is_dead_with_its_last_sign_of_life(clock):
    server, d = _Server(), None
    d = deaths.Deaths(server, KeySpace("rl"), grace_s=1.0)  # type: ignore[arg-type]
    server.live = {"w:1", "w:2"}
    assert d.check() == {}
    seen_ms = server.now_ms
    server.live = {"w:2"}
    assert _step(d, server, clock, 0.25) == {}  # missing, within the grace
    assert _step(d, server, clock, 0.5) == {}
    assert _step(d, server, clock, 0.5) == {"w:1": seen_ms}
    assert _step(d, server, clock, 2.0) == {}  # said once


def test_a_holder_back_within_the_grace_is_not_dead(clock):
    server = _Server()
    d = deaths.Deaths(server, KeySpace("rl"), grace_s=1.0)  # type: ignore[arg-type]
    server.live = {"w:1"}
    d.check()
    server.live = set()
    assert _step(d, server, clock, 0.75) == {}
    server.live = {"w:1"}  # its client reconnected
    assert _step(d, server, clock, 0.25) == {}
    assert _step(d, server, clock, 5.0) == {}


def test_a_name_never_seen_alive_nor_registered_is_never_found_dead(clock):
    server = _Server()
    d = deaths.Deaths(server, KeySpace("rl"), grace_s=1.0)  # type: ignore[arg-type]
    assert d.check() == {}
    assert _step(d, server, clock, 10.0) == {}


def test_a_registered_holder_never_listed_by_this_scanner_is_found_dead(clock):
    # It opened its connection, registered and died between two checks.
    server = _Server()
    d = deaths.Deaths(server, KeySpace("rl"), grace_s=1.0)  # type: ignore[arg-type]
    server.registered = {"w:gone"}
    first = server.now_ms
    assert d.check() == {}
    assert _step(d, server, clock, 0.5) == {}
    assert _step(d, server, clock, 0.5) == {"w:gone": first}


def test_a_new_run_id_pauses_every_verdict_while_the_processes_reconnect(clock):
    server = _Server()
    d = deaths.Deaths(server, KeySpace("rl"), grace_s=1.0, pause_s=5.0)  # type: ignore[arg-type]
    server.live = {"w:1", "w:2"}
    d.check()
    server.run_id, server.live = "b", set()  # restarted: every connection dropped
    assert _step(d, server, clock, 0.25) == {}
    server.live = {"w:1"}  # w:1 reconnects; w:2 died meanwhile
    assert _step(d, server, clock, 3.0) == {}
    assert _step(d, server, clock, 1.9) == {}  # still within the pause
    last_listed = d._seen["w:2"]
    assert _step(d, server, clock, 0.25) == {}  # the pause ended: w:2 missing from now
    assert _step(d, server, clock, 1.0) == {"w:2": last_listed}


def test_a_holder_that_unregistered_left_on_purpose_and_is_not_dead(clock):
    server = _Server()
    d = deaths.Deaths(server, KeySpace("rl"), grace_s=1.0)  # type: ignore[arg-type]
    server.live = {"w:1"}
    d.check()
    server.live, server.registered = set(), set()  # liveness.leave, then its exit
    assert _step(d, server, clock, 0.5) == {}
    assert _step(d, server, clock, 5.0) == {}


def test_a_server_that_refuses_client_list_turns_the_check_off(clock, caplog):
    server = _Server()
    server.refuse = True
    d = deaths.Deaths(server, KeySpace("rl"))  # type: ignore[arg-type]
    assert d.check() == {} and d.disabled
    assert "heartbeat expiry only" in caplog.text


def test_a_cluster_failing_over_is_no_refusal_the_check_goes_on(clock):
    # A Redis Cluster answers CLUSTERDOWN, for every slot, while a master's slots are
    # failed over: a ResponseError, which must not read as "CLIENT LIST refused".
    server = _Server()
    d = deaths.Deaths(server, KeySpace("rl"))  # type: ignore[arg-type]
    server.live = {"w1"}
    assert _step(d, server, clock, 0.25) == {}
    server.cluster_down = True
    assert _step(d, server, clock, 0.25) == {} and not d.disabled
    server.cluster_down, server.live = False, set()
    assert _step(d, server, clock, 0.25) == {}
    assert "w1" in _step(d, server, clock, 1.5)  # still watching: its death is found


def test_a_follower_watches_a_live_leader_and_lists_once_it_is_gone(clock):
    server = _Server()
    server.live, server.leader = {"scanner:L", "L:1", "w:1"}, "scanner:L"
    d = deaths.Deaths(server, KeySpace("rl"), grace_s=1.0)  # type: ignore[arg-type]
    assert d.check(watch=True) == {} and server.listed == 1  # learns the leader's id
    for _ in range(3):
        assert d.check(watch=True) == {}
    assert (server.listed, server.watched) == (1, 3)
    server.live = {"w:1"}  # the leader's worker killed, scanner and pool process
    assert d.check(watch=True) == {} and server.listed == 2
    assert set(_step(d, server, clock, 1.0)) == {"scanner:L", "L:1"}


def test_a_redis_before_6_2_gets_the_full_list_from_every_scanner(clock, caplog):
    server = _Server()
    server.live, server.leader, server.before_6_2 = {"scanner:L", "w:1"}, "scanner:L", True
    d = deaths.Deaths(server, KeySpace("rl"), grace_s=1.0)  # type: ignore[arg-type]
    assert d.check(watch=True) == {}
    assert d.check(watch=True) == {} and d.no_watch and not d.disabled
    assert d.check(watch=True) == {}
    assert (server.listed, server.watched) == (3, 1)
    server.live = {"scanner:L"}
    assert d.check(watch=True) == {}
    clock[0] += 1.0
    assert set(d.check(watch=True)) == {"w:1"}  # deaths still found by every scanner


def test_an_unchanged_list_is_one_command_and_every_fourth_reads_the_run_id_and_holders(clock):
    # Issue 37: an idle leader's check is CLIENT LIST alone; the run id and the
    # registered holders are read once every FULL_EVERY lists; who leads, never.
    server = _Server()
    server.live = {"w:1", "w:2"}
    d = deaths.Deaths(server, KeySpace("rl"))  # type: ignore[arg-type]
    for _ in range(2 * deaths.FULL_EVERY):
        clock[0] += deaths.CHECK_S
        server.now_ms += int(deaths.CHECK_S * 1000)
        assert d.check(leading=True) == {}
    full = ("list", "info", "smembers")
    assert server.sent == ([full] + [("list",)] * (deaths.FULL_EVERY - 1)) * 2
    assert server.times == 1  # the clock was read once (store/clock.py)


def test_a_list_that_changed_reads_the_run_id_at_once_so_a_restart_pauses_every_verdict(
    clock,
):
    server = _Server()
    server.live = {"w:1", "w:2"}
    d = deaths.Deaths(server, KeySpace("rl"), grace_s=1.0, pause_s=5.0)  # type: ignore[arg-type]
    assert d.check(leading=True) == {}
    assert _step(d, server, clock, 0.25) == {} and server.sent[-1] == ("list", "get")
    server.run_id, server.live = "b", {"w:1"}  # restarted; w:2 not reconnected yet
    assert _step(d, server, clock, 0.25) == {}
    assert server.sent[-2:] == [("list", "get"), ("info", "smembers")]
    for _ in range(8):  # well past the grace: paused, not dead
        assert _step(d, server, clock, 0.25) == {}
    server.live = {"w:1", "w:2"}
    assert _step(d, server, clock, 0.25) == {}
