"""G10, the whole class: every Lua script, its reply lost after Redis ran it.

For each ``.lua`` file in ``relier_django/core/store/lua`` (found by listing the folder, so a
new script fails here until it has a scenario), the scenario's call is made twice on
a freshly flushed Redis, both times through the lost-reply proxy with relier's own
clients (retry policy, fast lane): once as it is, once with the reply of that script's
call dropped after Redis ran it. The caller must get the same answer, and Redis must
hold the same state (keys, values, counts, history, which keys have a TTL) either way:
the client's replay is recognised (request tokens, "already mine" answers) instead of
acting twice.

Four scripts are never replayed by design, because their callers make one attempt:
``admit.lua`` (the standalone admission check, on a pipelined connection without
retries), ``ratelimit.lua`` (a view's hit, on a fail-fast client), ``take.lua`` and
``take_inflight.lua`` (a worker's take, on kombu's consuming connection, which never
resends a command). For
them the lost reply reaches the caller as a ConnectionError (or the view's documented
fallback), and the state is that of one call: a unit is never counted twice, and a
message taken is marked held by its taker, which is how it comes back (one TTL later,
since its live taker never refreshes what it never received).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

import pytest
import redis

from relier_django.core.broker import publish, redis_channel
from relier_django.core.broker.marker import MARKER_HEADER
from relier_django.core.dlq import dead_letter as dlq
from relier_django.core.dlq import release
from relier_django.core.dlq.store import DeadLetterStore
from relier_django.core.extras import lock, ratelimit
from relier_django.core.model import config, outcome, workflow
from relier_django.core.model.envelope import Envelope, decode
from relier_django.core.model.failure import Failure, Reason
from relier_django.core.model.limits import Gate
from relier_django.core.model.rates import Rate
from relier_django.core.model.timing import Timing
from relier_django.core.model.transition import history_tail
from relier_django.core.push import admission, idempotency, producer
from relier_django.core.recovery import deaths
from relier_django.core.schedule import periodic
from relier_django.core.store import cancel as store_cancel
from relier_django.core.store import checkpoint, chords, handover, scripts
from relier_django.core.store import progress as store_progress
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from relier_django.core.worker import adoption, fencing, intake
from relier_django.core.worker.reservations import Reservations
from testproject.celery import app
from testproject.demo import tasks
from testproject.lostreply import LostReplyProxy, config_through

TASK_ID = "replay-task"
Scenario = Callable[[config.Config, redis.Redis], Any]


@dataclass(frozen=True)
class Case:
    run: Scenario
    replayed: bool = True  # False: its callers make one attempt (see the module docstring)
    setup_runs: int = 0  # how many times its set-up runs the script under test first


def _keys(cfg: config.Config) -> KeySpace:
    return KeySpace.of(cfg)


@functools.cache
def _the_envelope() -> Any:
    # One envelope for both runs of a scenario: the same bytes, the same checksum.
    return producer.prepare(tasks.record.relier_spec, ("x",), {}, TASK_ID)


def _env(cfg: config.Config) -> Any:
    return _the_envelope()


def _store(cfg: config.Config, client: redis.Redis, token: str = "push-1") -> Any:
    env = _env(cfg)
    assert (
        idempotency.store(_keys(cfg), env, env.encode(), 60_000, 3, token=token).run(client).stored
    )
    return env


def _started(cfg: config.Config, client: redis.Redis) -> Any:
    env = _store(cfg, client)
    assert fencing.start(_keys(cfg), env, "w1@host:1", 30_000).run(client).started
    return env


def _dead(cfg: config.Config, client: redis.Redis) -> Any:
    env = _started(cfg, client)
    failure = Failure(Reason.EXCEPTION, "ValueError", "boom", worker="w1@host:1")
    assert dlq.dead_letter(_keys(cfg), failure, 60_000, env=env).run(client).accepted
    return env


def _expired(cfg: config.Config, client: redis.Redis) -> Any:
    env = _store(cfg, client)
    client.zadd(_keys(cfg).of_task(env.id).expiry, {env.id: 1})
    return env


def _resurrect_call(cfg: config.Config, token: str = "pass-1") -> scripts.ScriptCall[Any]:
    keys = _keys(cfg)
    return scripts.ScriptCall(
        scripts.RESURRECT,
        keys.for_resurrect([TASK_ID]),
        [30_000, "scanner-1", token, 10_000, 60_000, TASK_ID],
        list,
    )


def _releasing(cfg: config.Config, client: redis.Redis) -> Any:
    """release.lua has run for the dead task: the entry is marked, fence 2 is stored."""
    env = _dead(cfg, client)
    nxt = env.next_incarnation(attempt=1)
    tail = history_tail("released", fence=nxt.fence)
    keys = _keys(cfg)
    code = scripts.ScriptCall(
        scripts.RELEASE,
        keys.for_release(env.id, env.id, None),
        [env.id, env.id, nxt.encode(), nxt.fence, env.task, env.queue, 3, 60_000, tail,
         env.fence, "release-1"],
        int,
    ).run(client)  # fmt: skip
    assert code == 1
    return nxt


# -- one scenario per script: the call whose reply is lost, after its set-up ------------
def push(cfg: config.Config, client: redis.Redis) -> Any:
    env = _env(cfg)
    gates = admission.limits(_keys(cfg), cfg, env.task, Rate.parse("5/m"))
    return idempotency.store(_keys(cfg), env, env.encode(), 60_000, 3, gates, token="p").run(client)


def abort(cfg: config.Config, client: redis.Redis) -> Any:
    env = _store(cfg, client, token="push-1")
    return idempotency.abort(_keys(cfg), env, "push-1").run(client)


def start(cfg: config.Config, client: redis.Redis) -> Any:
    env = _store(cfg, client)
    return fencing.start(_keys(cfg), env, "w1@host:1", 30_000).run(client)


def heartbeat(cfg: config.Config, client: redis.Redis) -> Any:
    env = _started(cfg, client)
    return fencing.heartbeat(_keys(cfg), [(env.id, env.fence)], 30_000).run(client)


def commit(cfg: config.Config, client: redis.Redis) -> Any:
    env = _started(cfg, client)
    record = outcome.succeeded({"ok": 1}, env.fence)
    return fencing.commit(_keys(cfg), env, record, 60_000).run(client)


def commit_trail(cfg: config.Config, client: redis.Redis) -> Any:
    # A django.tasks task keeps its hash and history with the result (keys.trail).
    env = _started(cfg, client)
    record = outcome.succeeded({"ok": 1}, env.fence)
    return fencing.commit(_keys(cfg), env, record, 60_000, keep_trail=True).run(client)


def commit_chain(cfg: config.Config, client: redis.Redis) -> Any:
    # A chain step's commit also stores and queues the next step (docs/workflows.md).
    env = _started(cfg, client)
    record = outcome.succeeded(3, env.fence)
    nxt = Envelope(
        id="replay-next", task="demo.step_add", args=(3, 4), created_ms=1, workflow=env.id
    )
    queued = publish.Queued("replay-queue", "the message")  # its list's doorbell is rung too
    successor = fencing.Successor(nxt, nxt.encode(), queued, 60_000, 3)
    return fencing.commit(_keys(cfg), env, record, 60_000, successor=successor).run(client)


def commit_chord(cfg: config.Config, client: redis.Redis) -> Any:
    # A chord member's commit that completes the header creates the callback.
    env = _started(cfg, client)
    chords.set_size(client, _keys(cfg), "replay-group", 2)
    client.hset(_keys(cfg).chord("replay-group"), "r:0", "1")  # the other member's
    record = outcome.succeeded(3, env.fence)
    callback = Envelope(id="replay-cb", task="demo.step_sum", created_ms=1, header="replay-group")
    successor = fencing.Successor(
        callback, callback.encode(), None, 60_000, 3, "replay-group", 1, outcome.result_json(record)
    )
    return fencing.commit(_keys(cfg), env, record, 60_000, successor=successor).run(client)


def retry(cfg: config.Config, client: redis.Redis) -> Any:
    env = _started(cfg, client)
    nxt = env.next_incarnation(attempt=2)
    call = fencing.retry(_keys(cfg), env, nxt, 1_000, 60_000, "ValueError: x", encoded=nxt.encode())
    return call.run(client)


def dead_letter(cfg: config.Config, client: redis.Redis) -> Any:
    env = _started(cfg, client)
    failure = Failure(Reason.EXCEPTION, "ValueError", "boom", worker="w1@host:1")
    return dlq.dead_letter(_keys(cfg), failure, 60_000, env=env).run(client)


def resurrect(cfg: config.Config, client: redis.Redis) -> Any:
    _expired(cfg, client)
    return _resurrect_call(cfg).run(client)


def resurrected(cfg: config.Config, client: redis.Redis) -> Any:
    env = _expired(cfg, client)
    lease = _resurrect_call(cfg).run(client)
    fence = int(lease[0][1])
    tail = history_tail("resurrected", fence=fence, scanner="scanner-1")
    call = scripts.ScriptCall(
        scripts.RESURRECTED,
        _keys(cfg).for_resurrected([env.id]),
        [60_000, env.id, fence, "", tail],
        list,
    )
    return call.run(client)


def leader(cfg: config.Config, client: redis.Redis) -> Any:
    call = scripts.ScriptCall(scripts.LEADER, _keys(cfg).for_leader(), ["scanner-1", 6_000], int)
    return call.run(client)


def leader_release(cfg: config.Config, client: redis.Redis) -> Any:
    client.set(_keys(cfg).leader, "scanner-1", px=6_000)
    call = scripts.ScriptCall(scripts.LEADER_RELEASE, _keys(cfg).for_leader(), ["scanner-1"], int)
    return call.run(client)


def handoff(cfg: config.Config, client: redis.Redis) -> Any:
    env = _started(cfg, client)
    return fencing.handoff(_keys(cfg), [(env.id, env.fence)], "running", "drain").run(client)


def handoff_death(cfg: config.Config, client: redis.Redis) -> Any:
    env = _started(cfg, client)
    held = [(env.id, env.fence)]
    return fencing.handoff(_keys(cfg), held, "running", "pool_death", "signal:SIGKILL").run(client)


def handoff_late_death(cfg: config.Config, client: redis.Redis) -> Any:
    """The main process's report comes after the scanner resurrected the task (its
    pool process's connection closed first): a 'died' history entry, once."""
    env = _started(cfg, client)
    held = [(env.id, env.fence)]
    assert deaths.hand_off(_keys(cfg), [(env.id, "w1@host:1", 1_000)]).run(client) == 1
    assert _resurrect_call(cfg).run(client)[0][0] == 1
    return fencing.handoff(_keys(cfg), held, "running", "pool_death", "signal:SIGKILL").run(client)


def resurrect_death(cfg: config.Config, client: redis.Redis) -> Any:
    """A pool process's death with its cause, the hand-off's deadline passed: the
    'expired' history entry and the reply name it, once, replay or not."""
    env = _started(cfg, client)
    held = [(env.id, env.fence)]
    assert fencing.handoff(_keys(cfg), held, "running", "pool_death", "exit:3").run(client)
    client.zadd(_keys(cfg).of_task(env.id).expiry, {env.id: 1})
    return _resurrect_call(cfg).run(client)


def resurrect_oom_policy(cfg: config.Config, client: redis.Redis) -> Any:
    """An OOM death under max_resurrections={"oom": 0}: leased for the DLQ (code 2,
    death 'oom'), not resurrected; a replay answers the same, no second history entry."""
    env = _started(cfg, client)
    client.hset(_keys(cfg).of_task(env.id).task(env.id), "maxres", "3,oom=0")
    held = [(env.id, env.fence)]
    assert fencing.handoff(_keys(cfg), held, "running", "pool_death", "oom").run(client)
    client.zadd(_keys(cfg).of_task(env.id).expiry, {env.id: 1})
    reply = _resurrect_call(cfg).run(client)
    assert (reply[0][0], reply[0][7]) == (2, "oom")  # for the DLQ, as its policy says
    return reply


def orphans(cfg: config.Config, client: redis.Redis) -> Any:
    env = _started(cfg, client)  # held by w1@host:1, whose connection is gone
    return deaths.hand_off(_keys(cfg), [(env.id, "w1@host:1", 1_000)]).run(client)


def release_(cfg: config.Config, client: redis.Redis) -> Any:
    # The whole release (release.lua, publish, release_done.lua); release.lua's reply is lost.
    env = _dead(cfg, client)
    receipt = release.release(app, cfg, env.id)
    entry = DeadLetterStore(client, _keys(cfg)).get(env.id)
    return receipt.task_id, entry


def release_done(cfg: config.Config, client: redis.Redis) -> Any:
    nxt = _releasing(cfg, client)
    call = scripts.ScriptCall(
        scripts.RELEASE_DONE, _keys(cfg).for_release_done(nxt.id), [nxt.fence], int
    )
    return call.run(client)


def release_abort(cfg: config.Config, client: redis.Redis) -> Any:
    nxt = _releasing(cfg, client)
    keys = _keys(cfg)
    call = scripts.ScriptCall(
        scripts.RELEASE_ABORT,
        keys.for_release_abort(nxt.id, nxt.id, None),
        [nxt.id, nxt.id, nxt.fence],
        int,
    )
    return call.run(client)


def dlq_delete(cfg: config.Config, client: redis.Redis) -> Any:
    env = _dead(cfg, client)
    return DeadLetterStore(client, _keys(cfg)).delete([env.id], fences=[env.fence])


def checkpoint_(cfg: config.Config, client: redis.Redis) -> Any:
    env = _started(cfg, client)
    return checkpoint.save(_keys(cfg), env.id, env.fence, json.dumps({"inline": 3})).run(client)


def progress_(cfg: config.Config, client: redis.Redis) -> Any:
    env = _started(cfg, client)
    stored = store_progress.record("PROGRESS", {"done": 3, "total": 10}, 65_536)
    return store_progress.save(_keys(cfg), env.id, env.fence, stored).run(client)


def lock_acquire(cfg: config.Config, client: redis.Redis) -> Any:
    return lock.try_acquire(_keys(cfg), "nightly", 30_000).run(client)


def lock_extend(cfg: config.Config, client: redis.Redis) -> Any:
    token = lock.try_acquire(_keys(cfg), "nightly", 30_000).run(client)
    return lock.extend(_keys(cfg), "nightly", token, 30_000).run(client)


def lock_release(cfg: config.Config, client: redis.Redis) -> Any:
    token = lock.try_acquire(_keys(cfg), "nightly", 30_000).run(client)
    return lock.release_if_held(_keys(cfg), "nightly", token).run(client)


def _scheduled(cfg: config.Config, client: redis.Redis) -> Any:
    """A task pushed with a countdown whose due time has come."""
    env = _env(cfg)
    when = Timing(countdown_ms=60_000)
    assert (
        idempotency.store(_keys(cfg), env, env.encode(), 60_000, 3, token="p", when=when)
        .run(client)
        .scheduled
    )
    client.zadd(_keys(cfg).of_task(env.id).schedule, {env.id: 1})  # due long ago
    return env


def _take_call(cfg: config.Config, token: str = "take-1") -> scripts.ScriptCall[Any]:
    keys = _keys(cfg)
    return scripts.ScriptCall(
        scripts.SCHEDULE_TAKE, keys.for_schedule_take([TASK_ID]), [30_000, token, TASK_ID], list
    )


def schedule_take(cfg: config.Config, client: redis.Redis) -> Any:
    _scheduled(cfg, client)
    return _take_call(cfg).run(client)


def schedule_sent(cfg: config.Config, client: redis.Redis) -> Any:
    env = _scheduled(cfg, client)
    _take_call(cfg).run(client)
    keys = _keys(cfg)
    call = scripts.ScriptCall(
        scripts.SCHEDULE_SENT, keys.for_schedule_sent([env.id]),
        [60_000, "take-1", env.id, env.fence], int,
    )  # fmt: skip
    return call.run(client)


def tick(cfg: config.Config, client: redis.Redis) -> Any:
    client.hset(_keys(cfg).periodic, "nightly", 1_000)  # its last tick handled
    return periodic.claim(_keys(cfg), "nightly", 2_000, "tick-1", 30_000).run(client)


def tick_done(cfg: config.Config, client: redis.Redis) -> Any:
    client.hset(_keys(cfg).periodic, "nightly", 1_000)
    assert periodic.claim(_keys(cfg), "nightly", 2_000, "tick-1", 30_000).run(client).code == 1
    return periodic.done(_keys(cfg), "nightly", 2_000, "tick-1").run(client)


def cancel(cfg: config.Config, client: redis.Redis) -> Any:
    env = _started(cfg, client)
    return store_cancel.cancel(cfg, env.id)


def cancel_member(cfg: config.Config, client: redis.Redis) -> Any:
    # A chain's first step: filed in the DLQ with the rest of its chain, not removed.
    rest = ({"task": "demo.step_add", "id": "replay-next", "args": [1]},)
    env = dataclasses.replace(_env(cfg), chain=rest, workflow=TASK_ID)
    assert idempotency.store(_keys(cfg), env, env.encode(), 60_000, 3).run(client).stored
    return store_cancel.cancel(cfg, env.id)


# -- flow control (G14): the paths _limits.lua adds to push, schedule_take, commit,
# dead_letter and cancel; the plain layout only (a partitioned store refuses limits).
ONE_SLOT = Gate("t:demo.record|k", "", 1, "", 0, 0)
RATED = Gate("t:demo.record|k", "", 1, "t:demo.record|k", 1000, 0)


@functools.cache
def _other(label: str, task_id: str) -> Any:
    # The same bytes in both runs of a scenario, as _the_envelope.
    return producer.prepare(tasks.record.relier_spec, (label,), {}, task_id)


def _holder(cfg: config.Config, client: redis.Redis) -> Any:
    """Another task of the same scope, holding its one slot."""
    other = _other("y", "replay-holder")
    stored = idempotency.store(_keys(cfg), other, other.encode(), 60_000, 3, token="h",
                               gate=ONE_SLOT).run(client)  # fmt: skip
    assert stored.scheduled and client.hget(_keys(cfg).task(other.id), "lim_h") == "1"
    return other


def push_slot(cfg: config.Config, client: redis.Redis) -> Any:
    env = _env(cfg)
    return idempotency.store(_keys(cfg), env, env.encode(), 60_000, 3, token="p",
                             gate=ONE_SLOT).run(client)  # fmt: skip


def push_parked(cfg: config.Config, client: redis.Redis) -> Any:
    _holder(cfg, client)
    return push_slot(cfg, client)


def schedule_take_gated(cfg: config.Config, client: redis.Redis) -> Any:
    """A task due after a countdown takes its slot and its rate's time at dispatch."""
    env = _env(cfg)
    when = Timing(countdown_ms=60_000)
    assert idempotency.store(_keys(cfg), env, env.encode(), 60_000, 3, token="p", when=when,
                             gate=RATED).run(client).scheduled  # fmt: skip
    client.zadd(_keys(cfg).schedule, {env.id: 1})  # due long ago
    return _take_call(cfg).run(client)


def schedule_take_waits_for_rate(cfg: config.Config, client: redis.Redis) -> Any:
    """Its rate's time is reserved far ahead: it is made due then and counted as
    having waited for its rate (thr:rate:<family>), once."""
    env = _env(cfg)
    when = Timing(countdown_ms=60_000)
    assert idempotency.store(_keys(cfg), env, env.encode(), 60_000, 3, token="p", when=when,
                             gate=RATED).run(client).scheduled  # fmt: skip
    client.set(_keys(cfg).limit_rate(RATED.rate_scope), 4_000_000_000_000)  # in 2096
    client.zadd(_keys(cfg).schedule, {env.id: 1})
    return _take_call(cfg).run(client)


def schedule_take_parks(cfg: config.Config, client: redis.Redis) -> Any:
    _holder(cfg, client)
    env = _env(cfg)
    when = Timing(countdown_ms=60_000)
    assert idempotency.store(_keys(cfg), env, env.encode(), 60_000, 3, token="p", when=when,
                             gate=ONE_SLOT).run(client).scheduled  # fmt: skip
    client.zadd(_keys(cfg).schedule, {env.id: 1})
    return _take_call(cfg).run(client)


def _holding(cfg: config.Config, client: redis.Redis) -> Any:
    """This task holds the scope's one slot, started; another waits parked behind it."""
    env = push_slot(cfg, client) and _env(cfg)
    client.hset(_keys(cfg).task(env.id), "state", "queued")  # as the leader dispatched it
    assert fencing.start(_keys(cfg), env, "w1@host:1", 30_000).run(client).started
    waiting = _other("z", "replay-waiting")
    idempotency.store(_keys(cfg), waiting, waiting.encode(), 60_000, 3, token="w",
                      gate=ONE_SLOT).run(client)  # fmt: skip
    assert client.hget(_keys(cfg).task(waiting.id), "state") == "parked"
    return env


def commit_hands_over(cfg: config.Config, client: redis.Redis) -> Any:
    env = _holding(cfg, client)
    record = outcome.succeeded({"ok": 1}, env.fence)
    return fencing.commit(_keys(cfg), env, record, 60_000).run(client)


def commit_gated_successor(cfg: config.Config, client: redis.Redis) -> Any:
    """A chain step's commit creates a next step with flow control: it waits parked
    behind the scope's holder (never queued by the commit)."""
    _holder(cfg, client)
    env = _started(cfg, client)
    record = outcome.succeeded(3, env.fence)
    nxt = Envelope(
        id="replay-next", task="demo.step_add", args=(3, 4), created_ms=1, workflow=env.id
    )
    successor = fencing.Successor(nxt, nxt.encode(), None, 60_000, 3,
                                  gate=ONE_SLOT.script_arg())  # fmt: skip
    done = fencing.commit(_keys(cfg), env, record, 60_000, successor=successor).run(client)
    assert client.hget(_keys(cfg).task(nxt.id), "state") == "parked"
    return done


def commit_link(cfg: config.Config, client: redis.Redis) -> Any:
    """A commit with a chain's next step and two callbacks (link=): one stored due now
    for the leader's dispatch, one parked behind its scope's holder; each once."""
    _holder(cfg, client)
    env = _started(cfg, client)
    record = outcome.succeeded(3, env.fence)
    nxt = Envelope(
        id="replay-next", task="demo.step_add", args=(3, 4), created_ms=1, workflow=env.id
    )
    queued = publish.Queued("replay-queue", "the message")
    successor = fencing.Successor(nxt, nxt.encode(), queued, 60_000, 3)
    a = Envelope(id="replay-link-a", task="demo.step_add", args=(3, 1), created_ms=1)
    b = Envelope(id="replay-link-b", task="demo.record", args=("b",), created_ms=1)
    links = [fencing.Linked(a, a.encode(), 3),
             fencing.Linked(b, b.encode(), 2, ONE_SLOT.script_arg())]  # fmt: skip
    done = fencing.commit(_keys(cfg), env, record, 60_000, successor=successor, links=links).run(
        client
    )
    keys = _keys(cfg)
    assert [client.hget(keys.task(i), "state") for i in (a.id, b.id)] == ["scheduled", "parked"]
    assert client.zscore(keys.schedule, a.id) is not None
    return done


@functools.cache
def _with_errback() -> Any:
    errback = workflow.Step(task="demo.sync_record", id="replay-eb", max_resurrections=2)
    return producer.prepare(tasks.record.relier_spec, ("x",), {}, TASK_ID, link_error=[errback])


def dead_letter_link_error(cfg: config.Config, client: redis.Redis) -> Any:
    """A filing in the DLQ creates the task's errback (link_error=), given its id, once;
    on a partitioned store it records a hand-over, completed after (store/handover.py)."""
    env = _with_errback()
    keys = _keys(cfg)
    assert idempotency.store(keys, env, env.encode(), 60_000, 3, token="p").run(client).stored
    assert fencing.start(keys, env, "w1@host:1", 30_000).run(client).started
    failure = Failure(Reason.EXCEPTION, "ValueError", "boom", worker="w1@host:1")
    done = dlq.dead_letter(keys, failure, 60_000, env=env, now_ms=1).run(client)
    if keys.tagged:
        token = dlq.errback_token(env)
        assert handover.complete_recorded(client, keys, keys.of_task(env.id), token) == 1
    errback = decode(client.hget(keys.task("replay-eb"), "env"))
    assert (errback.args, client.hget(keys.task("replay-eb"), "maxres")) == ((TASK_ID,), "2")
    return done


def dead_letter_hands_over(cfg: config.Config, client: redis.Redis) -> Any:
    env = _holding(cfg, client)
    failure = Failure(Reason.EXCEPTION, "ValueError", "boom", worker="w1@host:1")
    return dlq.dead_letter(_keys(cfg), failure, 60_000, env=env).run(client)


@functools.cache
def _limited() -> Any:
    # A push with its own limit (push_with(limit=, concurrency_key=)): its envelope
    # keeps it, in the DLQ too.
    return producer.prepare(tasks.record.relier_spec, ("x",), {}, TASK_ID, flow=("single", "k"))


def release_gated(cfg: config.Config, client: redis.Redis) -> Any:
    """A released entry of a limited task is stored due now with its gate, for the
    leader to dispatch through it (nothing published): a replay of release.lua answers
    'gated' again, so nothing is published then either, and the entry goes once."""
    keys, env = _keys(cfg), _limited()
    assert idempotency.store(keys, env, env.encode(), 60_000, 3, token="p").run(client).stored
    assert fencing.start(keys, env, "w1@host:1", 30_000).run(client).started
    failure = Failure(Reason.EXCEPTION, "ValueError", "boom", worker="w1@host:1")
    assert dlq.dead_letter(keys, failure, 60_000, env=env).run(client).accepted
    receipt = release.release(app, cfg, env.id)
    stored = client.hmget(keys.task(env.id), "state", "lim", "fence")
    assert stored == ["scheduled", "n:single|k", "2"], stored
    return receipt.task_id, DeadLetterStore(client, keys).get(env.id), stored


def cancel_parked(cfg: config.Config, client: redis.Redis) -> Any:
    _holder(cfg, client)
    push_slot(cfg, client)
    return store_cancel.cancel(cfg, TASK_ID)


# -- debounce (issue 38): push.lua's debounce block and schedule_take's end of a window;
# the plain layout only (a partitioned store refuses debounce at push).
def _debounced(cfg: config.Config, client: redis.Redis, env: Any, token: str) -> Any:
    keys = _keys(cfg)
    record = (keys.debounce(env.task, "k"), 86_400_000)
    when = Timing(countdown_ms=60_000)
    call = idempotency.store(keys, env, env.encode(), 60_000, 3, token=token, when=when,
                             debounce=record)  # fmt: skip
    return call.run(client)


def push_debounced(cfg: config.Config, client: redis.Redis) -> Any:
    """A debounced push supersedes the task of its key still waiting: a replay of it
    must not supersede the task it just stored, nor record the first one twice."""
    assert _debounced(cfg, client, _other("p", "replay-prev"), "prev").scheduled
    return _debounced(cfg, client, _env(cfg), "p")


def push_superseded(cfg: config.Config, client: redis.Redis) -> Any:
    """A client retry of a push that a later push superseded since is answered
    "stored" (its outcome record names its envelope), and changes nothing."""
    assert _debounced(cfg, client, _env(cfg), "p").scheduled
    assert _debounced(cfg, client, _other("l", "replay-later"), "later").scheduled
    again = _debounced(cfg, client, _env(cfg), "p")
    assert again.stored and again.scheduled, again  # not "finished": it is the same push
    return again


def schedule_take_debounced(cfg: config.Config, client: redis.Redis) -> Any:
    """The leader's take of a debounced task ends its window: the record goes."""
    _debounced(cfg, client, _env(cfg), "p")
    client.zadd(_keys(cfg).schedule, {TASK_ID: 1})  # due long ago
    return _take_call(cfg).run(client)


def presence(cfg: config.Config, client: redis.Redis) -> Any:
    held = Reservations(cfg, worker="host-1:42")
    held.announce(alive=True)
    return client.zcard(_keys(cfg).workers)


def _taken_by(cfg: config.Config, taker: Any) -> Any:
    # One attempt, as kombu's consuming connection makes (it never resends a command).
    bells = [redis_channel.bell_of("celery")]
    kombus = sync_client(cfg, fail_fast=True)
    try:
        reply = kombus.execute_command(*taker.command(["celery"], bells))
    except redis.exceptions.NoScriptError as exc:
        assert taker.failed(exc)
        reply = kombus.execute_command(*taker.command(["celery"], bells))
    return taker.taken(reply)


def _queued(client: redis.Redis, task_id: str) -> None:
    message = json.dumps({"body": "", "headers": {"id": task_id, MARKER_HEADER: 1}})
    client.lpush("celery", message)


def take(cfg: config.Config, client: redis.Redis) -> Any:
    _queued(client, _store(cfg, client).id)
    return _taken_by(cfg, intake.Intake(cfg, "w1@host:1"))


def take_inflight(cfg: config.Config, client: redis.Redis) -> Any:
    # A broker apart from the store: the take keeps a copy in the taker's record.
    _queued(client, TASK_ID)
    return _taken_by(cfg, intake.InflightIntake("w1@host:1"))


def restore_inflight(cfg: config.Config, client: redis.Redis) -> Any:
    record = redis_channel.inflight_of("w1@host:1")
    client.hset(record, mapping={"#": 2, "1": "6:celery" + "first", "2": "6:celery" + "second"})
    call = scripts.ScriptCall(scripts.RESTORE_INFLIGHT, [record], [scripts.REPLAY_WINDOW_MS], int)
    return call.run(client)


@functools.cache
def _the_adopted() -> Any:
    # A plain Celery message's first incarnation, the same bytes in both runs.
    env = adoption.envelope_of(tasks.sync_record.relier_spec, TASK_ID, ("x",), {}, "celery")
    return dataclasses.replace(env, created_ms=1)


def adopt(cfg: config.Config, client: redis.Redis) -> Any:
    spec = tasks.sync_record.relier_spec
    return adoption.adopt(cfg, spec, _the_adopted(), "w1@host:1", token="adopt-1").run(client)


def adopt_redelivered(cfg: config.Config, client: redis.Redis) -> Any:
    # The same message adopted before (at receipt, or by another worker): answered
    # with the stored envelope, nothing written.
    spec = tasks.sync_record.relier_spec
    assert adoption.adopt(cfg, spec, _the_adopted(), "w1@host:1", token="first").run(client).new
    return adoption.adopt(cfg, spec, _the_adopted(), "w2@host:2", token="again").run(client)


def admit(cfg: config.Config, client: redis.Redis) -> Any:
    found = admission.limits(_keys(cfg), cfg, "t", Rate.parse("5/m"))
    return asyncio.run(admission.acheck(found, cfg))


def ratelimit_(cfg: config.Config, client: redis.Redis) -> Any:
    call = ratelimit.hit(_keys(cfg), "view", "1.2.3.4", Rate.parse("5/m"))
    return call.run(sync_client(cfg, fail_fast=True))


def _handover_record() -> str:
    nxt = Envelope(id="replay-next", task="demo.step_add", args=(3, 4), created_ms=1)
    return handover.record([handover.Handed(nxt.id, nxt.encode(), nxt.task, "", 3)], 60_000)


def commit_handover_record(cfg: config.Config, client: redis.Redis) -> Any:
    """A partitioned store's chain step: its commit records a hand-over instead of
    storing the next step (store/handover.py); run on the plain layout too."""
    env = _started(cfg, client)
    record = outcome.succeeded(3, env.fence)
    return fencing.commit_handing_over(
        _keys(cfg), env, record, 60_000, False, _handover_record()
    ).run(client)


def chord_member_completed(cfg: config.Config, client: redis.Redis) -> Any:
    """A partitioned store's chord member that completes the header: its commit records
    a hand-over, whose completion counts its result in the chord's partition
    (chord_member.lua) and stores the callback (store/handover.py)."""
    env = _started(cfg, client)
    keys = _keys(cfg)
    chords.set_size(client, keys, "replay-group", 2)
    client.hset(keys.chord("replay-group"), "r:0", "1")  # the other member's
    callback = Envelope(id="replay-cb", task="demo.step_sum", created_ms=1, header="replay-group")
    handed = handover.Handed(callback.id, callback.encode(), callback.task, "", 3)
    member = handover.Member("replay-group", 1, "3", handed)
    stored = handover.record([], 60_000, member)
    record = outcome.succeeded(3, env.fence)
    done = fencing.commit_handing_over(keys, env, record, 60_000, False, stored).run(client)
    assert done.accepted
    return handover.complete(client, keys, TASK_ID, stored)


def handover_completed(cfg: config.Config, client: redis.Redis) -> Any:
    """The hand-over completed after its commit: the next step stored in its partition
    (handover_store.lua), then the record forgotten (handover_done.lua)."""
    assert commit_handover_record(cfg, client).accepted
    return handover.complete(client, _keys(cfg), TASK_ID, _handover_record())


CASES: dict[str, Case] = {
    "push": Case(push),
    "abort": Case(abort),
    "start": Case(start),
    "heartbeat": Case(heartbeat),
    "commit": Case(commit),
    "retry": Case(retry),
    "dead_letter": Case(dead_letter),
    "resurrect": Case(resurrect),
    "resurrected": Case(resurrected),
    "leader": Case(leader),
    "leader_release": Case(leader_release),
    "handoff": Case(handoff),
    "release": Case(release_),
    "release_done": Case(release_done),
    "release_abort": Case(release_abort),
    "dlq_delete": Case(dlq_delete),
    "checkpoint": Case(checkpoint_),
    "progress": Case(progress_),
    "lock_acquire": Case(lock_acquire),
    "lock_extend": Case(lock_extend),
    "lock_release": Case(lock_release),
    "schedule_take": Case(schedule_take),
    "schedule_sent": Case(schedule_sent),
    "cancel": Case(cancel),
    "tick": Case(tick),
    "tick_done": Case(tick_done),
    "presence": Case(presence),
    "orphans": Case(orphans),
    "take": Case(take, replayed=False),
    "take_inflight": Case(take_inflight, replayed=False),
    "restore_inflight": Case(restore_inflight),
    "admit": Case(admit, replayed=False),
    "ratelimit": Case(ratelimit_, replayed=False),
    "adopt": Case(adopt),
    "handover_store": Case(handover_completed),
    "handover_done": Case(handover_completed),
    "chord_member": Case(chord_member_completed),
}


# A script with another path worth replaying: run as a case of that script.
VARIANTS: dict[str, tuple[str, Case]] = {
    "commit+trail": ("commit", Case(commit_trail)),
    "commit+chain": ("commit", Case(commit_chain)),
    "commit+chord": ("commit", Case(commit_chord)),
    "cancel+member": ("cancel", Case(cancel_member)),
    "push+slot": ("push", Case(push_slot)),
    "push+parked": ("push", Case(push_parked)),
    "schedule_take+gate": ("schedule_take", Case(schedule_take_gated)),
    "schedule_take+parks": ("schedule_take", Case(schedule_take_parks)),
    "schedule_take+waits_rate": ("schedule_take", Case(schedule_take_waits_for_rate)),
    "commit+hands_over": ("commit", Case(commit_hands_over)),
    "commit+gated_successor": ("commit", Case(commit_gated_successor)),
    "dead_letter+hands_over": ("dead_letter", Case(dead_letter_hands_over)),
    "release+gated": ("release", Case(release_gated)),
    "commit+link": ("commit", Case(commit_link)),
    "commit+handover_record": ("commit", Case(commit_handover_record)),
    "dead_letter+link_error": ("dead_letter", Case(dead_letter_link_error)),
    "cancel+parked": ("cancel", Case(cancel_parked)),
    "push+debounce": ("push", Case(push_debounced, setup_runs=1)),
    "push+superseded": ("push", Case(push_superseded, setup_runs=2)),
    "schedule_take+debounce": ("schedule_take", Case(schedule_take_debounced)),
    "adopt+redelivered": ("adopt", Case(adopt_redelivered, setup_runs=1)),
    "handoff+death": ("handoff", Case(handoff_death)),
    "resurrect+death": ("resurrect", Case(resurrect_death)),
    "resurrect+oom_policy": ("resurrect", Case(resurrect_oom_policy)),
    "handoff+late_death": ("handoff", Case(handoff_late_death)),
}
# Flow control runs on an unpartitioned store only (model/limits.py refuses it at push).
_UNPARTITIONED = {"push+slot", "push+parked", "schedule_take+gate", "schedule_take+parks",
                  "schedule_take+waits_rate", "commit+hands_over", "commit+gated_successor",
                  "dead_letter+hands_over", "release+gated", "cancel+parked", "push+debounce",
                  "push+superseded", "schedule_take+debounce",
                  # Links as commit.lua creates them: a partitioned store hands them
                  # over (commit+handover_record; errbacks: dead_letter+link_error).
                  "commit+link"}  # fmt: skip


def _script_names() -> list[str]:
    folder = resources.files("relier_django.core.store").joinpath("lua")
    return sorted(
        p.name.removesuffix(".lua")
        for p in folder.iterdir()
        if p.name.endswith(".lua") and not p.name.startswith("_")  # _x.lua: included fragments
    )


# -- normalising what differs between two runs by nature, not by behaviour -------------
# A Redis-clock time in ms, or one inverted (the DLQ's lex index sorts newest first).
_MS = re.compile(r"(?<!\d)\d{13}(?!\d)")
# uuid4s: request, run and attempt tokens (hex), kombu's delivery tags (dashed).
_TOKEN = re.compile(
    r"\b[0-9a-f]{32}\b|\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"
)


def _norm(value: Any) -> Any:
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if isinstance(value, str):
        # Tokens first: a hex token can hold a run of 13 digits.
        return _MS.sub("<ms>", _TOKEN.sub("<token>", value))
    if isinstance(value, float | int) and not isinstance(value, bool) and value > 1e12:
        return "<ms>"
    if isinstance(value, dict):
        return {_norm(k): _norm(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_norm(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return _norm(repr(value))
    return value


# The metrics hashes (_metrics.lua): a histogram's bucket and sum, and a window's slot,
# follow the clock; what must agree is how many observations and counts there are.
_METRIC_FIELD = re.compile(r"^(h:.+):(\d+|sum)$")
_SLOT = re.compile(r"^([mh])\d+(:.*)?$")


def _metrics_norm(key: str, value: dict[Any, Any]) -> dict[str, Any]:
    shown: dict[str, Any] = {}
    for raw_field, raw in value.items():
        field = raw_field.decode() if isinstance(raw_field, bytes) else raw_field
        count = int(raw)
        if key.endswith(":m:w"):
            slot = _SLOT.match(field)
            assert slot, field
            name = f"{slot[1]}<slot>{slot[2] or ''}"
            count = 1 if slot[2] in (None, ":rec_ms", ":rec_max") else count
        elif (histogram := _METRIC_FIELD.match(field)) is not None:
            name = f"{histogram[1]}:{'sum' if histogram[2] == 'sum' else 'n'}"
            count = 1 if histogram[2] == "sum" else count
        else:
            name = field
        shown[name] = shown.get(name, 0) + count if name.endswith(":n") else count
    return shown


def snapshot(client: redis.Redis) -> dict[str, Any]:
    """Every key of the database: its type, value and whether it has a TTL."""
    state: dict[str, Any] = {}
    for raw_key in client.scan_iter("*"):
        key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
        if key.startswith("_kombu."):
            continue  # kombu declares its bindings once per process, not per run
        kind = client.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else kind
        if kind == "string":
            value: Any = client.get(key)
        elif kind == "hash" and (key.endswith(":m") or key.endswith(":m:w")):
            value = _metrics_norm(key, client.hgetall(key))
        elif kind == "hash":
            value = client.hgetall(key)
        elif kind == "list":
            value = client.lrange(key, 0, -1)
        elif kind == "zset":
            value = client.zrange(key, 0, -1, withscores=True)
        elif kind == "set":
            value = sorted(client.smembers(key))
        elif kind == "stream":  # the delivery ledger: one event per act, ids on the clock
            value = [fields for _, fields in client.xrange(key)]
        else:
            value = kind
        state[str(_norm(key))] = (kind, _norm(value), client.pttl(key) > 0)
    return state


def _outcome(case: Case, cfg: config.Config, client: redis.Redis) -> Any:
    try:
        return _norm(case.run(cfg, client))
    except redis.exceptions.ConnectionError as exc:
        return ("ConnectionError", type(exc).__name__)


def _run_once(
    name: str,
    case: Case,
    proxy: LostReplyProxy,
    direct: redis.Redis,
    lose: bool,
    partitions: int = 1,
) -> tuple[Any, dict[str, Any], int]:
    direct.flushall()
    script = getattr(scripts, name.upper())
    laid_out = config.current().replace(partitions=partitions)
    with config_through(proxy, laid_out) as cfg:
        client = sync_client(cfg)
        before = proxy.calls(script.sha)
        if lose:
            # Armed for the scenario's own call: set-up calls of this same script, if
            # any, come first, so count them out by arming the nth run from here.
            proxy.drop_reply(script.sha, nth=(case.setup_runs or _setup_runs(name)) + 1)
        answer = _outcome(case, cfg, client)
        runs = proxy.calls(script.sha) - before
    return answer, snapshot(direct), runs


def _setup_runs(name: str) -> int:
    # Scenarios whose set-up runs the script under test before the call it is about.
    return {"resurrected": 0}.get(name, 0)


def test_every_script_has_a_replay_scenario() -> None:
    assert sorted(CASES) == _script_names(), "give every lua/*.lua a scenario in CASES"


def _layouts() -> list[Any]:
    """Every scenario on the plain layout and on a partitioned one (PARTITIONS > 1,
    docs/scaling.md: each key in its partition's slot, the absent keys named in it),
    except chains' and chords' as commit.lua creates them (a partitioned store hands
    them over: commit+handover_record, handover_store, chord_member), and take.lua,
    which runs on an unpartitioned store only (a worker on a partitioned one takes with
    take_inflight.lua, on the broker)."""
    cases = []
    for name in [*_script_names(), *VARIANTS]:
        cases.append(pytest.param(name, 1, id=f"{name}-plain"))
        if (
            name not in ("commit+chain", "commit+chord")
            and name != "take"
            and name not in _UNPARTITIONED
        ):
            cases.append(pytest.param(name, 4, id=f"{name}-partitioned"))
    return cases


@pytest.mark.parametrize(("name", "partitions"), _layouts())
def test_a_lost_reply_is_answered_as_the_first_call_and_changes_nothing_more(
    name: str, partitions: int, lost_reply: LostReplyProxy, redis_client: redis.Redis
) -> None:
    script, case = VARIANTS.get(name) or (name, CASES[name])
    plain = _run_once(script, case, lost_reply, redis_client, lose=False, partitions=partitions)
    lost = _run_once(script, case, lost_reply, redis_client, lose=True, partitions=partitions)
    (plain_answer, plain_state, plain_runs), (lost_answer, lost_state, lost_runs) = plain, lost
    assert lost_reply.dropped == 1, "the fault never fired: the scenario did not call the script"
    if case.replayed:
        assert lost_runs == plain_runs + 1, "the client did not replay the call"
        assert lost_answer == plain_answer
    else:
        assert lost_runs == plain_runs, "a one-attempt script was replayed"
        assert lost_answer == ("ConnectionError", "ConnectionError")
    assert lost_state == plain_state


def test_orphans_leaves_a_task_whose_holder_changed_after_the_scanner_read_it(redis_client):
    """The race orphans.lua closes: the leader reads a dead holder's tasks, then, before
    it hands them off, one moves on (resurrected by TTL and started by a live process).
    The script re-checks holder and state in one step: the live run is left alone."""
    cfg = config.current()
    client = sync_client(cfg)
    keys = _keys(cfg)
    env = _started(cfg, client)  # held by w1@host:1
    read = deaths.held_by(client, keys, {"w1@host:1": 1_000})
    assert read == [(env.id, "w1@host:1", 1_000)]
    # What start.lua writes when another process starts its next incarnation.
    client.hset(keys.task(env.id), mapping={"worker": "w2@host:2"})
    assert deaths.hand_off(keys, read).run(client) == 0
    assert client.hget(keys.task(env.id), "state") == "running"


def test_orphans_puts_a_dead_holders_running_task_before_its_reserved_backlog(redis_client):
    """A pass takes the expiry index in deadline order: the interrupted task (running)
    is dated 1 ms before the messages its worker had prefetched (queued), so it is
    re-dispatched first."""
    cfg = config.current()
    client = sync_client(cfg)
    keys = _keys(cfg)
    running = _started(cfg, client)  # held by w1@host:1
    reserved = producer.prepare(tasks.record.relier_spec, ("y",), {}, "replay-reserved")
    assert idempotency.store(keys, reserved, reserved.encode(), 60_000, 3).run(client).stored
    client.hset(keys.task(reserved.id), mapping={"worker": "w1@host:1"})  # heartbeat.lua's mark
    held = [(running.id, "w1@host:1", 5_000), (reserved.id, "w1@host:1", 5_000)]
    assert deaths.hand_off(keys, held).run(client) == 2
    assert client.zrange(keys.expiry, 0, -1, withscores=True) == [
        (running.id, 4_999.0),
        (reserved.id, 5_000.0),
    ]


def test_a_push_retried_after_its_task_already_committed_is_answered_stored(redis_client):
    """push.lua's reply lost, and the task it stored ran and committed before the
    client's retry came (found by the composition matrix: a group member on the
    lost-reply worker): the hash that named the push is gone, but the outcome names the
    push's token, so the retry is answered as the first call was, not refused as a
    second push of finished work. Another push under the same id still is."""
    cfg = config.current()
    client = sync_client(cfg)
    keys = _keys(cfg)
    env = _started(cfg, client)
    record = outcome.succeeded({"ok": 1}, env.fence, env.push)
    assert fencing.commit(keys, env, record, 60_000).run(client).accepted
    retried = idempotency.store(keys, env, env.encode(), 60_000, 3, token="push-1").run(client)
    assert retried.stored and not retried.id_finished
    assert client.get(keys.result(env.id)) == record  # and nothing was stored again
    assert not client.exists(keys.task(env.id))
    other = producer.prepare(tasks.record.relier_spec, ("x",), {}, env.id)
    again = idempotency.store(keys, other, other.encode(), 60_000, 3, token="p2").run(client)
    assert again.id_finished and not again.stored
