"""G11, periodic ticks against a real Redis: tick.lua under races, fire_due from three
scanners at once, a scanner killed between its claim and its push (or its record), and
the missed-tick policies. No worker runs (a tick's push is its stored task and its one
message in the broker's queue list), but in the test of an idempotent task's ticks,
which a real worker runs."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery.schedules import crontab
from django.core.checks import Error
from django.core.checks import Warning as CheckWarning

from relier_django.checks import tasks as checks
from relier_django.core.model import config
from relier_django.core.observe.audit import audit
from relier_django.core.schedule import periodic
from relier_django.core.store.keys import KeySpace
from testproject.celery import app
from testproject.demo import tasks  # noqa: F401 - registers the demo tasks
from testproject.demo import tasks as demo
from testproject.harness import REPO_ROOT, wait_until, worker_env

ENTRY = "every-second"
KEYS = KeySpace("rl")
QUEUE = "celery"  # the broker's list for the default queue


def _entry(every: float = 1.0, missed: str = "all", **extra: Any) -> dict[str, Any]:
    return {
        "task": "demo.sync_record",
        "schedule": every,
        "args": ("periodic",),
        "options": {"relier_missed": missed},
        **extra,
    }


@pytest.fixture
def beat_schedule() -> Iterator[dict[str, Any]]:
    """The app's beat_schedule, empty, restored after the test."""
    before = app.conf.beat_schedule
    schedule: dict[str, Any] = {}
    app.conf.beat_schedule = schedule
    try:
        yield schedule
    finally:
        app.conf.beat_schedule = before


@pytest.fixture
def cfg(redis_client: redis.Redis) -> config.Config:
    return config.current().replace(resurrect_lease_s=0.3)


def _now_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _pushed(client: redis.Redis) -> int:
    """Messages in the broker's queue: one per push that stored a task."""
    return int(client.llen(QUEUE))


def _has_task(client: redis.Redis, tick: int, entry: str = ENTRY) -> bool:
    return bool(client.exists(KEYS.task(periodic.tick_id(entry, tick))))


# -- tick.lua -------------------------------------------------------------------------
def _race_claims(client: redis.Redis, tick: int) -> list[tuple[int, str]]:
    """Three callers claim ``tick`` at the same instant; their (code, token)s."""
    barrier, codes = threading.Barrier(3), []

    def claim(token: str) -> None:
        barrier.wait()
        codes.append((periodic.claim(KEYS, ENTRY, tick, token, 30_000).run(client).code, token))

    threads = [threading.Thread(target=claim, args=(f"t{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return codes


def test_of_three_concurrent_claims_on_a_tick_exactly_one_wins(redis_client):
    redis_client.hset(KEYS.periodic, ENTRY, 0)
    for tick in range(1_000, 21_000, 1_000):
        codes = _race_claims(redis_client, tick)
        winners = [token for code, token in codes if code == 1]
        assert len(winners) == 1 and sorted(c for c, _ in codes) == [1, 2, 2]
        assert periodic.done(KEYS, ENTRY, tick, winners[0]).run(redis_client) == tick
        assert periodic.claim(KEYS, ENTRY, tick, "late", 30_000).run(redis_client).code == 0


def test_a_claim_whose_holder_died_is_taken_over_with_its_own_tick(redis_client):
    redis_client.hset(KEYS.periodic, ENTRY, 0)
    assert periodic.claim(KEYS, ENTRY, 1_000, "dead", 200).run(redis_client).tick == 1_000
    # Live: another caller is told to wait, even for a later tick.
    assert periodic.claim(KEYS, ENTRY, 2_000, "b", 200).run(redis_client).code == 2
    time.sleep(0.3)
    taken = periodic.claim(KEYS, ENTRY, 2_000, "b", 200).run(redis_client)
    assert (taken.code, taken.tick) == (1, 1_000)  # the older tick first: it may be unpushed
    # The dead holder's record, if it ever came, drops nothing of the new holder's.
    periodic.done(KEYS, ENTRY, 1_000, "dead").run(redis_client)
    assert redis_client.hget(KEYS.periodic_claims, ENTRY)


def test_a_tick_stored_by_a_claimer_that_died_before_sending_it_is_sent_by_the_next(
    redis_client, beat_schedule, cfg
):
    """A tick's push stores, then publishes (its due time is given, so the store cannot
    queue it in the same step). A scanner killed between the two left the tick's task
    stored and unsent: the scanner that takes the claim over finds it pushed and sends
    it again (a second message of fence 1 would be refused by start.lua), instead of
    leaving it to QUEUED_GRACE_S (an hour)."""
    from relier_django.core.model.envelope import Envelope
    from relier_django.core.push import idempotency

    beat_schedule[ENTRY] = _entry(every=1.0)
    tick = (_now_ms(redis_client) - 5_000) // 1000 * 1000
    redis_client.hset(KEYS.periodic, ENTRY, tick - 1000)
    assert periodic.claim(KEYS, ENTRY, tick, "dead", 200).run(redis_client).tick == tick
    env = Envelope(id=periodic.tick_id(ENTRY, tick), task="demo.sync_record",
                   args=("periodic",), created_ms=tick)  # fmt: skip
    idempotency.store(KEYS, env, env.encode(), 60_000, 3, token="dead").run(redis_client)
    assert _has_task(redis_client, tick) and _pushed(redis_client) == 0
    time.sleep(0.3)  # the dead claimer's lease runs out
    periodic.fire_due(app, cfg, tick + 500)
    assert _pushed(redis_client) == 1  # sent once, by the scanner that took over
    periodic.fire_due(app, cfg, tick + 600)
    assert _pushed(redis_client) == 1  # the tick is recorded: not sent a third time


def test_an_entry_seen_for_the_first_time_starts_at_the_next_tick(redis_client):
    assert periodic.claim(KEYS, ENTRY, 5_500, "a", 1_000, seed=True).run(redis_client).code == 0
    assert periodic.claim(KEYS, ENTRY, 6_000, "b", 1_000, seed=True).run(redis_client).code == 1
    assert int(redis_client.hget(KEYS.periodic, ENTRY)) == 5_500


# -- fire_due -------------------------------------------------------------------------
def test_three_scanners_firing_at_once_push_every_tick_exactly_once(
    redis_client, beat_schedule, cfg
):
    beat_schedule[ENTRY] = _entry(every=1.0)
    # Ten seconds of passes, four per tick, all in the past: each tick's eta has come,
    # so its push queues it at once.
    start = (_now_ms(redis_client) - 15_000) // 1000 * 1000
    redis_client.hset(KEYS.periodic, ENTRY, start)
    steps = [start + 250 * i for i in range(1, 41)]
    barrier = threading.Barrier(3)
    errors: list[BaseException] = []

    def scanner() -> None:
        try:
            for now in steps:
                barrier.wait()
                periodic.fire_due(app, cfg, now)
        except BaseException as exc:  # reported by the test
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=scanner) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    ticks = range(start + 1_000, steps[-1] + 1, 1_000)
    assert all(_has_task(redis_client, t) for t in ticks)
    assert _pushed(redis_client) == len(ticks) == 10
    assert int(redis_client.hget(KEYS.periodic, ENTRY)) == ticks[-1]
    assert not redis_client.hgetall(KEYS.periodic_claims)
    # Each tick in the delivery ledger once, however many scanners fired it (relier_audit).
    assert redis_client.xlen(KEYS.ledger) == 10
    found = audit(redis_client, KEYS, 0, slack_ms=3000)
    assert (found.in_flight_by_state, found.unexplained) == ({"queued": 10}, 0)


def _run_dying_scanner(redis_url: str, mode: str) -> int:
    env = worker_env(redis_url, {"DEMO_PERIODIC_EVERY_S": "1", "RELIER_RESURRECT_LEASE_S": "0.3"})
    proc = subprocess.run(
        [sys.executable, "-m", "tests.periodic_runner", mode],
        cwd=REPO_ROOT, env=env, capture_output=True, timeout=60,
    )  # fmt: skip
    return proc.returncode


@pytest.mark.parametrize("mode", ["die-after-claim", "die-after-push"])
def test_a_scanner_killed_between_its_steps_loses_no_tick_and_fires_none_twice(
    mode, redis_server, redis_client, beat_schedule, cfg
):
    # The same entry as the dying process's settings give it (DEMO_PERIODIC_EVERY_S).
    beat_schedule["demo-periodic"] = _entry(every=1.0)
    now = _now_ms(redis_client)
    redis_client.hset(KEYS.periodic, "demo-periodic", now - 1_000)  # one tick due
    assert _run_dying_scanner(redis_server.url, mode) == -9
    tick = int(redis_client.hget(KEYS.periodic_claims, "demo-periodic").split(b":")[0])
    assert _pushed(redis_client) == (1 if mode == "die-after-push" else 0)
    assert int(redis_client.hget(KEYS.periodic, "demo-periodic")) < tick  # not recorded
    time.sleep(0.4)  # the dead scanner's claim runs out
    periodic.fire_due(app, cfg, tick + 500)
    assert _has_task(redis_client, tick, "demo-periodic")
    # Died after its push: the takeover finds the tick's task stored and not started,
    # and sends it again, not knowing whether the first message was sent (here it was):
    # two messages of one task at fence 1, of which start.lua starts one.
    assert _pushed(redis_client) == (2 if mode == "die-after-push" else 1)
    assert int(redis_client.hget(KEYS.periodic, "demo-periodic")) == tick
    assert not redis_client.hgetall(KEYS.periodic_claims)


@pytest.mark.parametrize(
    ("missed", "fired", "skipped"), [("all", 10, 90), ("once", 1, 99), ("skip", 0, 100)]
)
def test_missed_ticks_follow_the_entrys_policy_and_are_never_skipped_silently(
    missed, fired, skipped, redis_client, beat_schedule, cfg, caplog
):
    beat_schedule[ENTRY] = _entry(every=60.0, missed=missed)
    newest = _now_ms(redis_client) // 60_000 * 60_000
    redis_client.hset(KEYS.periodic, ENTRY, newest - 100 * 60_000)  # 100 ticks missed
    late = newest + 30_000  # the newest tick is 30 s late: not on time for "skip"
    with caplog.at_level(logging.WARNING, logger="relier_django.periodic"):
        periodic.fire_due(app, cfg, late)
    assert _pushed(redis_client) == fired
    assert f"skipped {skipped} tick(s)" in caplog.text
    assert int(redis_client.hget(KEYS.periodic, ENTRY)) == newest
    periodic.fire_due(app, cfg, late + 1_000)  # recorded: nothing more, no new warning
    assert _pushed(redis_client) == fired


def test_the_task_sees_its_tick_as_its_due_time(redis_client, beat_schedule, cfg):
    beat_schedule[ENTRY] = _entry(every=1.0)
    now = _now_ms(redis_client)
    redis_client.hset(KEYS.periodic, ENTRY, now - 1_000)
    periodic.fire_due(app, cfg, now)
    tick = now // 1_000 * 1_000
    stored = redis_client.hget(KEYS.task(periodic.tick_id(ENTRY, tick)), "due_ms")
    assert int(stored) == tick  # start.lua hands it to the task as ctx.scheduled_at


def test_an_idempotent_task_runs_once_per_tick_and_a_direct_push_is_never_taken_for_a_tick(
    worker, redis_client, beat_schedule, cfg, relier_log
):
    relier_log.set_level(logging.INFO, logger="relier_django.periodic")
    beat_schedule["charge"] = {"task": "demo.charge", "schedule": 1.0, "args": ("monthly", 5)}
    runs = "demo:exec:charge:monthly"  # one entry per run of the body
    start = (_now_ms(redis_client) - 10_000) // 1000 * 1000
    redis_client.hset(KEYS.periodic, "charge", start)
    for n in range(1, 4):  # three ticks, each fired once its predecessor has committed
        periodic.fire_due(app, cfg, start + n * 1_000)
        wait_until(lambda n=n: redis_client.llen(runs) == n, 20, what=f"tick {n} run")
    # The same arguments pushed directly: a push of their own, not a tick's duplicate,
    # and idempotent among themselves as ever.
    direct = demo.charge.push_with(on_commit=False).push("monthly", 5)
    assert not direct.deduplicated and direct.get(timeout=30)["task_id"] == direct.task_id
    again = demo.charge.push_with(on_commit=False).push("monthly", 5)
    assert again.duplicate_of == direct.task_id
    assert redis_client.llen(runs) == 4
    # The log says "fired" for a push that runs, once per tick: never for a duplicate.
    fired = [r for r in relier_log.records if "entry=charge tick=" in r.getMessage()]
    assert len(fired) == 3 and all(" fired task=demo.charge" in r.getMessage() for r in fired)


@pytest.mark.parametrize("partitions", [1, 4])
def test_unfinished_idempotent_ticks_and_a_direct_push_of_their_arguments_are_each_stored(
    partitions, redis_client, beat_schedule, cfg, relier_log
):
    # No worker: each tick's task stays unfinished, so a key shared by the ticks (their
    # arguments') would answer the second tick, and the direct push, "duplicate". With
    # partitions, a tick's id must be drawn where its own key's claim lives, or the
    # push is refused (producer._placed).
    laid_out = cfg.replace(partitions=partitions)
    keys = KeySpace.of(laid_out)
    relier_log.set_level(logging.INFO, logger="relier_django.periodic")
    beat_schedule["charge"] = {"task": "demo.charge", "schedule": 1.0, "args": ("monthly", 5)}
    start = (_now_ms(redis_client) - 10_000) // 1000 * 1000
    config.override(laid_out)
    try:
        redis_client.hset(keys.periodic, "charge", start)
        periodic.fire_due(app, laid_out, start + 2_000)  # two ticks due
        (entry,), _ = periodic.read_entries(app)
        ids = [periodic.entry_tick_id(app, entry, start + n * 1_000, keys) for n in (1, 2)]
        assert all(redis_client.exists(keys.task(i)) for i in ids)
        direct = demo.charge.push_with(on_commit=False).push("monthly", 5)
    finally:
        config.override(None)
    assert not direct.deduplicated and direct.task_id not in ids
    fired = [r.getMessage() for r in relier_log.records if "entry=charge tick=" in r.getMessage()]
    assert len(fired) == 2 and all(" fired task=demo.charge" in m for m in fired)
    assert not [r for r in relier_log.records if r.levelno >= logging.ERROR]


def test_fire_due_answers_the_next_tick(redis_client, beat_schedule, cfg):
    beat_schedule[ENTRY] = _entry(every=10.0)
    assert periodic.fire_due(app, cfg, 1_700_000_003_000) == 1_700_000_010_000


class _BrokenCrontab(crontab):
    """A schedule whose ticks cannot be computed: it raises at every pass."""

    def remaining_delta(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("this crontab cannot say when it fires")


@pytest.fixture
def fresh_log_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's memory of which entries it logged, emptied: each is logged once."""
    monkeypatch.setattr(periodic, "_failing", {}, raising=False)
    monkeypatch.setattr(periodic, "_warned", set())


def _fire_for_three_ticks(client: redis.Redis, cfg: config.Config, *entries: str) -> range:
    """Seven passes, half a second apart, over three ticks of every second, with
    ``entries`` last recorded just before them; the three ticks."""
    start = (_now_ms(client) - 10_000) // 1000 * 1000
    for name in entries:
        client.hset(KEYS.periodic, name, start)
    steps = [start + 500 * i for i in range(1, 8)]
    for now in steps:
        periodic.fire_due(app, cfg, now)
    return range(start + 1_000, steps[-1] + 1, 1_000)


def test_an_infinite_nan_or_zero_interval_is_not_fired_and_never_stops_the_other_entries(
    redis_client, beat_schedule, cfg, relier_log, fresh_log_memory
):
    # The bad entries come first: the scanner meets them before the good one.
    beat_schedule.update({
        "infinite": _entry(every=float("inf")),
        "not-a-number": _entry(every=float("nan")),
        "zero": _entry(every=0),
        ENTRY: _entry(every=1.0),
    })  # fmt: skip
    ticks = _fire_for_three_ticks(redis_client, cfg, ENTRY)
    assert all(_has_task(redis_client, t) for t in ticks) and _pushed(redis_client) == 3
    not_fired = [r.getMessage() for r in relier_log.records if "is not fired" in r.getMessage()]
    # Each once, though seven passes read them.
    expected = ["entry=infinite", "entry=not-a-number", "entry=zero"]
    assert sorted(m.split()[1] for m in not_fired) == expected


def test_an_entry_failing_at_every_pass_never_stops_another_entrys_ticks_and_is_logged_once(
    redis_client, beat_schedule, cfg, relier_log, fresh_log_memory
):
    beat_schedule.update({"broken": _entry(every=_BrokenCrontab(minute="*")), ENTRY: _entry()})
    ticks = _fire_for_three_ticks(redis_client, cfg, "broken", ENTRY)
    assert all(_has_task(redis_client, t) for t in ticks) and _pushed(redis_client) == 3
    failed = [r for r in relier_log.records if "entry=broken: firing failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info  # with its traceback, not at every pass


# -- manage.py check ------------------------------------------------------------------
def test_check_reports_each_entry_relier_cannot_fire(beat_schedule):
    beat_schedule.update(
        {
            "ok": _entry(),
            "typo": {"task": "demo.no_such_task", "schedule": 5},
            "bad-schedule": _entry(every="5"),
            "bad-policy": _entry(missed="sometimes"),
            "bad-args": {**_entry(), "args": ("a", "b", "c", "d")},
            "plain": {"task": "demo.plain_record", "schedule": 5, "args": ("x",)},
        }
    )
    found = {m.id: m for m in checks.check_periodic_schedule()}
    by_id = sorted(m.id for m in checks.check_periodic_schedule())
    assert by_id == ["relier.E008", "relier.E009", "relier.E010", "relier.E010", "relier.W005"]
    assert isinstance(found["relier.E008"], Error) and "typo" in found["relier.E008"].msg
    assert isinstance(found["relier.W005"], CheckWarning)
    assert "celery beat" in found["relier.W005"].msg and "plain" in found["relier.W005"].msg
    assert "crontab" in found["relier.E009"].hint


@pytest.mark.parametrize(
    ("every", "says"),
    [
        (float("inf"), "finite number of seconds > 0, got inf"),
        (float("nan"), "finite number of seconds > 0, got nan"),
        (0, "finite number of seconds > 0, got 0"),
        (-60, "finite number of seconds > 0, got -60"),
        (1e12, "at most 3153600000 seconds (100 years), got 1000000000000.0"),
        (0.0001, "at least 0.001 seconds"),
    ],
)
def test_check_names_an_entry_whose_interval_is_infinite_nan_or_out_of_range(
    every, says, beat_schedule
):
    beat_schedule.update({"ok": _entry(), "bad-interval": _entry(every=every)})
    (message,) = checks.check_periodic_schedule()
    assert message.id == "relier.E009" and isinstance(message, Error)
    assert "'bad-interval'" in message.msg and says in message.msg
