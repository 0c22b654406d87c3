"""Flow control given at the call (issue 38, docs/flow-control.md "Per call"): a push's
own ``limit=`` (a ``RELIER["LIMITS"]`` name) and ``concurrency_key=`` (the key itself)
through every spelling a caller has: ``push_with``, ``apply_async`` (so beat's own
calls), a signature's ``.set()`` (a chain's later step, created by a commit), a
periodic entry's ``options`` and django.tasks' ``Task.using()``. Bad values fail at the
call, or at ``manage.py check`` for a periodic entry.

``demo.lim.free`` has no limit of its own; ``single`` (testproject/settings.py) is one
slot per key. With a prefork worker of 4 processes, the records of the tasks' own
starts and ends show at most one run of a key at a time, in push order: without the
call's limit, four would overlap.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from celery import chain

from relier_django import result
from relier_django.checks import tasks as checks
from relier_django.core.model import config
from relier_django.core.model.errors import ConfigError
from relier_django.core.schedule import periodic
from relier_django.core.store.keys import KeySpace
from testproject.celery import app
from testproject.demo import limit_tasks
from tests.integration.test_limits import (
    _most_at_once,
    _no_limit_keys_left,
    _records,
    _wait_for,
    _wait_for_start,
)

RUN = "t"
KEYS = KeySpace("rl")


def _starts(client: Any, key: str) -> list[str]:
    return [label for kind, k, label, _, _ in _records(client) if kind == "start" and k == key]


def test_push_with_a_limit_runs_a_task_without_one_a_key_at_a_time_in_push_order(
    worker_factory, redis_client
):
    worker_factory(concurrency=4)
    for i in range(4):
        for key in ("a", "b"):
            limit_tasks.free.push_with(limit="single", concurrency_key=key).push(
                RUN, key, f"{key}{i}", 0.1
            )
    _wait_for(redis_client, 8)
    assert _most_at_once(_records(redis_client)) == {"a": 1, "b": 1}
    assert _starts(redis_client, "a") == ["a0", "a1", "a2", "a3"]
    assert _starts(redis_client, "b") == ["b0", "b1", "b2", "b3"]
    _no_limit_keys_left(redis_client)


def test_the_call_s_limit_is_in_the_envelope_and_the_stored_gate(redis_client):
    receipt = limit_tasks.free.push_with(limit="single", concurrency_key=42).push(RUN, "k", "x")
    stored = redis_client.hgetall(KEYS.task(receipt.task_id))
    env = json.loads(stored[b"env"])
    assert (env["limit"], env["limit_key"]) == ("single", "42")
    assert stored[b"lim"] == b"n:single|42"  # per_key: the key is part of the scope
    # The task's own arguments say nothing: a plain push of it is not gated.
    plain = limit_tasks.free.push(RUN, "k", "y")
    assert b"lim" not in redis_client.hgetall(KEYS.task(plain.task_id))
    assert "limit" not in json.loads(redis_client.hget(KEYS.task(plain.task_id), "env"))


def test_apply_async_and_a_signature_s_set_carry_the_limit(worker_factory, redis_client):
    worker_factory(concurrency=4)
    limit_tasks.free.apply_async((RUN, "c", "c0", 0.1), limit="single", concurrency_key="c")
    sig = limit_tasks.free.s(RUN, "c", "c1", 0.1).set(limit="single", concurrency_key="c")
    sig.apply_async()
    limit_tasks.free.signature(
        (RUN, "c", "c2", 0.1), options={"limit": "single", "concurrency_key": "c"}
    ).delay()
    _wait_for(redis_client, 3)
    assert _most_at_once(_records(redis_client)) == {"c": 1}
    assert _starts(redis_client, "c") == ["c0", "c1", "c2"]
    _no_limit_keys_left(redis_client)


def test_a_chain_step_set_with_a_limit_waits_for_its_slot(worker_factory, redis_client):
    """The step is created by its predecessor's commit (commit.lua): the signature's
    ``.set(limit=...)`` rides in the chain, so the step waits while another push of its
    key holds the one slot."""
    worker_factory(concurrency=4)
    blocker = limit_tasks.free.push_with(limit="single", concurrency_key="w").push(
        RUN, "w", "blocker", 1.0
    )
    _wait_for_start(redis_client, "blocker")
    steps = chain(
        limit_tasks.free.si(RUN, "z", "head", 0.0),
        limit_tasks.free.si(RUN, "w", "step", 0.0).set(limit="single", concurrency_key="w"),
    ).apply_async()
    assert result(steps.id).get(timeout=30) == "step"
    assert blocker.get(timeout=30) == "blocker"
    records = _records(redis_client)
    assert _most_at_once(records)["w"] == 1, records
    assert _starts(redis_client, "w") == ["blocker", "step"]
    _no_limit_keys_left(redis_client)


@pytest.fixture
def beat_schedule():  # type: ignore[no-untyped-def]
    before = app.conf.beat_schedule
    schedule: dict[str, Any] = {}
    app.conf.beat_schedule = schedule
    try:
        yield schedule
    finally:
        app.conf.beat_schedule = before


def _entry(**options: Any) -> dict[str, Any]:
    return {
        "task": "demo.lim.free",
        "schedule": 1.0,
        "args": (RUN, "p", "tick"),
        "options": options,
    }


def test_a_periodic_entry_s_options_carry_the_limit_to_its_ticks(redis_client, beat_schedule):
    beat_schedule["limited"] = _entry(limit="single", concurrency_key="p")
    entries, rejected = periodic.read_entries(app, sources=False)
    assert rejected == []
    assert [e.flow for e in entries] == [("single", "p")]
    seconds, micros = redis_client.time()
    now = int(seconds) * 1000 + int(micros) // 1000
    redis_client.hset(KEYS.periodic, "limited", now - 1_000)  # its last tick: a second ago
    periodic.fire_due(app, config.current(), now)
    tick = periodic.tick_id("limited", now // 1_000 * 1_000)
    stored = redis_client.hgetall(KEYS.task(tick))
    assert stored[b"lim"] == b"n:single|p"
    assert json.loads(stored[b"env"])["limit"] == "single"


def test_check_names_a_periodic_entry_whose_limit_is_not_one(beat_schedule):
    beat_schedule.update(
        {
            "undefined": _entry(limit="nope"),
            "keys-nothing": _entry(concurrency_key="p"),
            "bad-key": _entry(limit="single", concurrency_key={"a": 1}),
            "fine": _entry(limit="single", concurrency_key=7),
        }
    )
    found = checks.check_periodic_schedule()
    assert sorted(m.id for m in found) == ["relier.E010"] * 3
    said = " ".join(m.msg for m in found)
    assert "'nope' is not in RELIER['LIMITS'] (shared, single)" in said
    assert "'concurrency_key' 'p' keys nothing" in said
    assert "takes the key itself" in said


def test_bad_call_options_are_refused_at_the_call_and_store_nothing(redis_client):
    free = limit_tasks.free
    with pytest.raises(TypeError, match="limit= takes a RELIER"):
        free.push_with(limit=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="takes the key itself"):
        free.push_with(limit="single", concurrency_key=["a"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be 1 to 128 printable"):
        free.push_with(limit="single", concurrency_key="x" * 200)
    with pytest.raises(ValueError, match="keys nothing"):
        free.push_with(concurrency_key="a").push(RUN, "k", "x")
    with pytest.raises(ConfigError, match="limit='nope' is not in RELIER"):
        free.apply_async((RUN, "k", "x"), limit="nope")
    with pytest.raises(TypeError, match="takes the key itself"):
        free.apply_async((RUN, "k", "x"), limit="single", concurrency_key=1.5)
    with pytest.raises(ValueError, match="keys nothing"):
        chain(free.si(RUN, "k", "a"), free.si(RUN, "k", "b").set(concurrency_key="k")).apply_async()
    with pytest.raises(TypeError, match="errback whose task has flow control"):
        free.apply_async((RUN, "k", "x"), link_error=free.si(RUN, "k", "e").set(limit="single"))
    assert list(redis_client.scan_iter("rl:t:*")) == []


def test_a_task_with_its_own_limit_takes_the_call_s_instead(worker_factory, redis_client):
    """``demo.lim.per_key`` allows 2 at once per customer; a push with
    ``limit="single"`` takes that limit instead: one at a time."""
    worker_factory(concurrency=4)
    for i in range(3):
        limit_tasks.per_key.push_with(limit="single").push(RUN, "q", f"q{i}", 0.1)
    _wait_for(redis_client, 3)
    assert _most_at_once(_records(redis_client)) == {"q": 1}
    _no_limit_keys_left(redis_client)


def test_a_relayed_outbox_row_and_a_replayed_envelope_go_through_their_gate(redis_client):
    """Both store an envelope made earlier (the relay: a row whose post-commit send
    failed; replay: a logged one): the task's own limit and the push's own are kept."""
    from relier_django.core.push import outbox, producer

    signer = config.current().signer
    own = producer.prepare(limit_tasks.per_key.relier_spec, (RUN, "c", "x"), {})
    called = producer.prepare(
        limit_tasks.free.relier_spec, (RUN, "k", "y"), {}, flow=("single", "k")
    )
    outbox.send(app, outbox.Row(own.id, own.encode(signer)))
    producer.replay(app, called.encode(signer))
    assert redis_client.hget(KEYS.task(own.id), "lim") == b"t:demo.lim.per_key|c"
    assert redis_client.hget(KEYS.task(called.id), "lim") == b"n:single|k"
