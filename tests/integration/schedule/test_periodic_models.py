"""Issue 39: django-celery-beat's PeriodicTask rows fired by relier's scanners
(``RELIER["CELERY_BEAT_MODELS"]``), against a real Redis and the test database: a row
added, edited, disabled, re-enabled or deleted takes effect at the next pass; an edit
never fires a tick twice; scanners racing fire each tick once; a database outage keeps
the last rows read. The first test runs a real worker on a database it shares with the
test (SQLite and PostgreSQL), the row written by another process, as an admin would."""

from __future__ import annotations

import json
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
from django.db import connection
from django_celery_beat.models import (
    ClockedSchedule,
    CrontabSchedule,
    IntervalSchedule,
    PeriodicTask,
    PeriodicTasks,
)

from relier_django.checks import tasks as checks
from relier_django.core.model import config
from relier_django.core.schedule import periodic, ticks
from relier_django.core.store.keys import KeySpace
from relier_django.db import celery_beat
from testproject.celery import app
from testproject.demo import tasks  # noqa: F401 - registers the demo tasks
from testproject.harness import REPO_ROOT, wait_until, worker_env

pytestmark = pytest.mark.django_db(transaction=True)

ENTRY = "from-the-admin"
KEYS = KeySpace("rl")


@pytest.fixture
def models_on(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """CELERY_BEAT_MODELS on, beat_schedule empty, the source's memory fresh."""
    settings.RELIER = {**settings.RELIER, "CELERY_BEAT_MODELS": True}
    before = app.conf.beat_schedule
    app.conf.beat_schedule = {}
    monkeypatch.setattr(periodic, "_warned", set())
    celery_beat.source.forget()
    try:
        yield
    finally:
        app.conf.beat_schedule = before
        celery_beat.source.forget()


@pytest.fixture
def fired(relier_log: pytest.LogCaptureFixture) -> Any:
    """The task ids of the ticks logged as fired, in order (a tick's push is stored
    whether its eta is past, queued, or to come, scheduled: its log line says so)."""
    relier_log.set_level(logging.INFO, logger="relier_django.periodic")

    def ids(entry: str = ENTRY) -> list[str]:
        said = [r.getMessage() for r in relier_log.records]
        assert not [m for m in said if "already pushed" in m]  # never even tried twice
        return [
            m.rsplit("task_id=", 1)[1]
            for m in said
            if f"entry={entry} tick=" in m and " fired task=" in m
        ]

    return ids


def _ids(ticks_ms: Any, entry: str = ENTRY) -> list[str]:
    return [periodic.tick_id(entry, t) for t in ticks_ms]


@pytest.fixture
def cfg(redis_client: redis.Redis) -> config.Config:
    return config.current().replace(resurrect_lease_s=0.3)


def _now_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _has_task(client: redis.Redis, tick: int, entry: str = ENTRY) -> bool:
    return bool(client.exists(KEYS.task(periodic.tick_id(entry, tick))))


def _every(seconds: int) -> IntervalSchedule:
    interval, _ = IntervalSchedule.objects.get_or_create(
        every=seconds, period=IntervalSchedule.SECONDS
    )
    return interval


def _row(name: str = ENTRY, every: int = 1, **fields: Any) -> PeriodicTask:
    fields.setdefault("task", "demo.sync_record")
    fields.setdefault("args", json.dumps(["periodic"]))
    if "crontab" not in fields and "clocked" not in fields:
        fields["interval"] = _every(every)
    return PeriodicTask.objects.create(name=name, **fields)


def _fire(cfg: config.Config, start: int, end: int, step: int = 250) -> None:
    """Passes every ``step`` ms from after ``start``, and one at ``end``."""
    for now in [*range(start + step, end, step), end]:
        periodic.fire_due(app, cfg, now)


# -- a real worker, the row written by another process --------------------------------
def _on_shared_db(shared_db: Any, redis_url: str, code: str) -> None:
    """Run ``code`` (Django ORM, django-celery-beat's models imported) in a process of
    its own on the shared database, as the admin of another process would."""
    prelude = (
        "import django, json; django.setup(); "
        "from django_celery_beat.models import IntervalSchedule, PeriodicTask; "
    )
    done = subprocess.run(
        [sys.executable, "-c", prelude + code],
        cwd=REPO_ROOT, env=worker_env(redis_url, shared_db.env()), capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_a_row_added_at_runtime_runs_on_a_worker_and_disabling_it_stops_it(
    shared_db, redis_server, redis_client, worker_factory
):
    label = f"admin-{shared_db.kind}"
    runs = f"demo:exec:{label}"
    worker = worker_factory(
        extra_env=shared_db.env(TESTPROJECT_CELERY_BEAT_MODELS="1", RELIER_SCAN_INTERVAL_S="0.5")
    )
    _on_shared_db(
        shared_db,
        redis_server.url,
        "every, _ = IntervalSchedule.objects.get_or_create(every=1, period='seconds'); "
        f"PeriodicTask.objects.create(name={ENTRY!r}, task='demo.sync_record', "
        f"interval=every, args=json.dumps([{label!r}]))",
    )
    # Seen at a pass, fired from its next tick: a few runs within seconds.
    wait_until(lambda: redis_client.llen(runs) >= 3, 60, what="three ticks of the new row")
    _on_shared_db(
        shared_db,
        redis_server.url,
        f"t = PeriodicTask.objects.get(name={ENTRY!r}); t.enabled = False; t.save()",
    )
    time.sleep(2.5)  # a pass (0.5 s) reads the change; a tick already pushed still runs
    settled = redis_client.llen(runs)
    time.sleep(3)
    assert redis_client.llen(runs) == settled
    # Each run was a tick of its own, fired once: the scanner's log names each.
    said = [line for line in worker.log_text().splitlines() if f"entry={ENTRY} tick=" in line]
    fired = [line.split(" tick=")[1].split()[0] for line in said if " fired task=" in line]
    assert len(fired) == len(set(fired)) == settled


def _ticks_said(worker: Any, what: str) -> list[str]:
    """The tick times of ``ENTRY`` a worker's scanner logged with ``what``."""
    said = [line for line in worker.log_text().splitlines() if f"entry={ENTRY} tick=" in line]
    return [line.split(" tick=")[1].split()[0] for line in said if what in line]


@pytest.mark.parametrize("shared_db", ["pg"], indirect=True)
def test_a_rows_ticks_fire_once_across_a_leader_sigkilled_and_replaced(
    shared_db, redis_server, redis_client, worker_factory
):
    from datetime import datetime, timedelta

    env = shared_db.env(TESTPROJECT_CELERY_BEAT_MODELS="1", RELIER_SCAN_INTERVAL_S="0.5")
    workers = [worker_factory(extra_env=env), worker_factory(extra_env=env)]
    _on_shared_db(
        shared_db,
        redis_server.url,
        "every, _ = IntervalSchedule.objects.get_or_create(every=1, period='seconds'); "
        f"PeriodicTask.objects.create(name={ENTRY!r}, task='demo.sync_record', "
        "interval=every, args=json.dumps(['failover']))",
    )
    wait_until(lambda: any(len(_ticks_said(w, " fired")) >= 3 for w in workers), 60,
               what="three ticks from the leader")  # fmt: skip
    leader = max(workers, key=lambda w: len(_ticks_said(w, " fired")))
    (other,) = [w for w in workers if w is not leader]
    before = _ticks_said(other, " fired")
    leader.kill()
    wait_until(lambda: len(_ticks_said(other, " fired")) >= len(before) + 3, 60,
               what="three ticks from the scanner left")  # fmt: skip
    # Every tick from the first to the last fired by one of them, once: a tick the dead
    # leader pushed without saying so is "already pushed" for the one that took over.
    fired = _ticks_said(leader, " fired") + _ticks_said(other, " fired")
    assert len(fired) == len(set(fired))
    seen = sorted(set(fired) | set(_ticks_said(other, "already pushed")))
    times = [datetime.fromisoformat(t) for t in seen]
    assert times == [times[0] + timedelta(seconds=i) for i in range(len(times))]


@pytest.mark.parametrize("shared_db", ["sqlite"], indirect=True)
def test_beat_on_relier_database_scheduler_runs_plain_rows_and_leaves_rl_task_rows_to_relier(
    shared_db, redis_server, redis_client, worker_factory, tmp_path
):
    # With a settings entry of an @rl_task too ("demo-beat", every 5 s): beat must not
    # copy it into the table, where it would be a second entry of that name.
    env = shared_db.env(
        TESTPROJECT_CELERY_BEAT_MODELS="1", RELIER_SCAN_INTERVAL_S="0.5", DEMO_BEAT_EVERY_S="5"
    )
    worker_factory(extra_env=env)
    _on_shared_db(
        shared_db,
        redis_server.url,
        "every, _ = IntervalSchedule.objects.get_or_create(every=1, period='seconds'); "
        f"PeriodicTask.objects.create(name={ENTRY!r}, task='demo.sync_record', "
        "interval=every, args=json.dumps(['db-relier'])); "
        "PeriodicTask.objects.create(name='plain-row', task='demo.plain_record', "
        "interval=every, args=json.dumps(['db-plain']))",
    )
    beat = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "testproject", "beat", "--loglevel", "INFO",
         "-S", "relier_django.beat:DatabaseScheduler", "--max-interval", "1"],
        cwd=REPO_ROOT, env=worker_env(redis_server.url, env),
        stdout=open(tmp_path / "beat.log", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
        start_new_session=True,
    )  # fmt: skip
    try:
        wait_until(lambda: int(redis_client.get("demo:plain:db-plain") or 0) >= 2, 60,
                   what="beat to run the plain row twice")  # fmt: skip
        wait_until(lambda: redis_client.llen("demo:exec:db-relier") >= 4, 60,
                   what="four ticks of the @rl_task row")  # fmt: skip
    finally:
        beat.terminate()
        try:
            beat.wait(timeout=20)
        except subprocess.TimeoutExpired:
            beat.kill()
            beat.wait()
    time.sleep(1.5)  # a tick fired as beat stopped has time to run
    # Every run of the @rl_task row came through a claimed tick (its task id is the
    # tick's), none from beat's own apply_async: no tick ran twice.
    done = {k.decode().split("{")[1].rstrip("}") for k in redis_client.keys("rl:r:*")}
    now_s = int(time.time())
    ticks_ms = [s * 1000 for s in range(now_s - 180, now_s + 2)]
    assert done <= set(_ids(ticks_ms)) | set(_ids(ticks_ms, "demo-beat"))
    ran = redis_client.llen("demo:exec:db-relier") + redis_client.llen("demo:exec:beat")
    assert ran == len(done)
    assert "ERROR" not in (tmp_path / "beat.log").read_text()
    names = {row[0] for row in shared_db.query("SELECT name FROM django_celery_beat_periodictask")}
    assert "demo-beat" not in names and {ENTRY, "plain-row"} <= names


# -- edits, in process ----------------------------------------------------------------
def test_an_edited_interval_takes_effect_at_the_next_pass_and_fires_no_tick_twice(
    models_on, redis_client, cfg, fired
):
    row = _row(every=1)
    t0 = _now_ms(redis_client)
    periodic.fire_due(app, cfg, t0)  # first seen: starts at its next tick
    # Ticks of every second up to a multiple of 3 s, which the edited interval (3 s)
    # names too: already fired, it must not fire again.
    edge = (t0 // 3_000 + 2) * 3_000
    _fire(cfg, t0, edge)
    before = list(range(t0 // 1_000 * 1_000 + 1_000, edge + 1, 1_000))
    assert fired() == _ids(before)
    assert int(redis_client.hget(KEYS.periodic, ENTRY)) == edge
    row.interval = _every(3)
    row.save()
    end = edge + 9_000
    _fire(cfg, edge, end)
    after = list(range(edge + 3_000, end + 1, 3_000))
    assert fired() == _ids(before + after)  # the edge once, then every 3 s
    assert all(_has_task(redis_client, t) for t in before + after)
    assert int(redis_client.hget(KEYS.periodic, ENTRY)) == end


def test_a_crontab_row_fires_in_its_own_timezone(models_on, redis_client, cfg, fired):
    every_minute, _ = CrontabSchedule.objects.get_or_create(
        minute="*", hour="*", day_of_week="*", day_of_month="*", month_of_year="*",
        timezone="Asia/Kolkata",
    )  # fmt: skip
    _row(crontab=every_minute)
    (entry,), _ = periodic.read_entries(app)
    assert isinstance(entry.schedule, ticks.Cron) and str(entry.schedule.tz) == "Asia/Kolkata"
    now = _now_ms(redis_client)
    periodic.fire_due(app, cfg, now)
    nxt = (now // 60_000 + 1) * 60_000
    periodic.fire_due(app, cfg, nxt + 100)
    assert fired() == _ids([nxt])


def test_disabling_or_deleting_a_row_stops_it_and_re_enabling_catches_up_nothing(
    models_on, redis_client, cfg, fired, relier_log
):
    row = _row(every=1)
    t0 = _now_ms(redis_client)
    periodic.fire_due(app, cfg, t0)
    _fire(cfg, t0, t0 + 2_000)
    assert len(fired()) == 2
    row.enabled = False
    row.save()
    _fire(cfg, t0 + 2_000, t0 + 5_000)
    assert len(fired()) == 2
    count = len(fired())
    row.delete()
    _fire(cfg, t0 + 5_000, t0 + 8_000)
    assert len(fired()) == count
    # Another row, last fired ten minutes ago, then disabled, re-enabled now: with the
    # default policy ("all") a settings entry would fire the newest ten missed ticks;
    # a row fires from its change on.
    again = _row("again", every=1)
    redis_client.hset(KEYS.periodic, "again", t0 - 600_000)
    again.enabled = False
    again.save()
    again.enabled = True
    again.save()
    changed = _now_ms(redis_client)
    periodic.fire_due(app, cfg, changed + 1_500)
    assert 1 <= len(fired("again")) <= 2  # the ticks after the change only
    assert int(redis_client.hget(KEYS.periodic, "again")) > changed
    # Skipped, like any tick not fired, with its count: never silently.
    (skipped,) = [
        r.getMessage() for r in relier_log.records if "entry=again skipped" in r.getMessage()
    ]
    assert "before its last change" in skipped
    assert 599 <= int(skipped.split(" skipped ")[1].split()[0]) <= 601


def test_an_expired_row_fires_no_more_and_a_row_waits_for_its_start_time(
    models_on, redis_client, cfg, fired
):
    from django.utils import timezone

    soon = timezone.now() + timezone.timedelta(seconds=30)
    _row(expires=timezone.now() - timezone.timedelta(seconds=1))
    _row("later", start_time=soon)
    entries, _ = periodic.read_entries(app)
    assert [e.name for e in entries] == ["later"]
    (later,) = entries
    assert later.since_ms == int(soon.timestamp() * 1000)
    now = _now_ms(redis_client)
    periodic.fire_due(app, cfg, now)
    _fire(cfg, now, now + 3_000)
    assert fired("later") == []  # its start time is 30 s away
    _fire(cfg, now + 3_000, later.since_ms + 1_000, step=1_000)
    assert fired("later") == _ids([later.since_ms // 1_000 * 1_000 + 1_000], "later")
    assert fired() == []


# -- scanners racing ------------------------------------------------------------------
def test_three_scanners_firing_a_row_at_once_push_every_tick_exactly_once(
    models_on, redis_client, cfg, fired
):
    _row(every=1)
    t0 = _now_ms(redis_client)
    periodic.fire_due(app, cfg, t0)
    steps = [t0 + 250 * i for i in range(1, 41)]
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
        finally:
            connection.close()  # this thread's own

    threads = [threading.Thread(target=scanner) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    ticks_due = list(range(t0 // 1_000 * 1_000 + 1_000, steps[-1] + 1, 1_000))
    assert len(ticks_due) == 10 and fired() == _ids(ticks_due)
    assert all(_has_task(redis_client, t) for t in ticks_due)
    assert not redis_client.hgetall(KEYS.periodic_claims)


# -- the database away ----------------------------------------------------------------
def _rename(table: str, to: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER TABLE "{table}" RENAME TO "{to}"')


def test_a_database_outage_keeps_the_last_rows_read_and_is_logged_once(
    models_on, redis_client, cfg, relier_log, fired
):
    _row(every=1)
    t0 = _now_ms(redis_client)
    periodic.fire_due(app, cfg, t0)  # read, and first seen
    # Both tables gone: every read fails as it would with the database down.
    _rename("django_celery_beat_periodictasks", "away_periodictasks")
    _rename("django_celery_beat_periodictask", "away_periodictask")
    try:
        _fire(cfg, t0, t0 + 3_000)
    finally:
        _rename("away_periodictasks", "django_celery_beat_periodictasks")
        _rename("away_periodictask", "django_celery_beat_periodictask")
    assert len(fired()) == 3  # the last rows read kept firing
    failed = [r for r in relier_log.records if "reading the database failed" in r.getMessage()]
    assert len(failed) == 1 and "the last 1 row(s) read are fired" in failed[0].getMessage()
    PeriodicTask.objects.filter(name=ENTRY).update(enabled=False)
    PeriodicTasks.update_changed()  # as a bulk update() must: it moves no last_update
    periodic.fire_due(app, cfg, t0 + 4_000)
    assert len(fired()) == 3  # read again: disabled
    assert any("read again" in r.getMessage() for r in relier_log.records)


def test_a_database_down_from_the_start_fires_no_row_and_says_so(
    models_on, redis_client, cfg, relier_log, fired
):
    _row(every=1)
    _rename("django_celery_beat_periodictasks", "away_periodictasks")
    try:
        t0 = _now_ms(redis_client)
        _fire(cfg, t0 - 250, t0 + 2_000)
    finally:
        _rename("away_periodictasks", "django_celery_beat_periodictasks")
    assert fired() == []
    (failed,) = [r for r in relier_log.records if "reading the database failed" in r.getMessage()]
    assert "no rows were read yet" in failed.getMessage()


# -- what relier does not fire --------------------------------------------------------
def test_a_row_named_as_a_settings_entry_is_not_fired_and_the_settings_entry_is(
    models_on, redis_client, cfg, relier_log
):
    app.conf.beat_schedule = {ENTRY: {"task": "demo.sync_record", "schedule": 1.0, "args": ("s",)}}
    _row(every=3)
    entries, rejected = periodic.read_entries(app)
    assert [(e.name, e.schedule) for e in entries] == [(ENTRY, ticks.Every(1_000))]
    (taken,) = rejected
    assert (taken.where, taken.problem) == (celery_beat.WHERE, periodic.Problem.NAME_TAKEN)
    periodic.fire_due(app, cfg, _now_ms(redis_client))
    assert any(
        f"entry={ENTRY} (django-celery-beat) is not fired" in r.getMessage()
        for r in relier_log.records
    )


def test_one_off_clocked_and_plain_celery_rows_are_not_fired_by_relier(models_on):
    from django.utils import timezone

    _row("one-off", one_off=True)
    clock = ClockedSchedule.objects.create(clocked_time=timezone.now())
    _row("clocked", clocked=clock, one_off=True)
    _row("plain", task="demo.plain_record")
    _row("bad-json", args="[not json")
    _row("fine")
    entries, rejected = periodic.read_entries(app)
    assert [e.name for e in entries] == ["fine"]
    problems = {r.entry: r.problem for r in rejected}
    assert problems == {
        "one-off": periodic.Problem.BAD_ENTRY,
        "clocked": periodic.Problem.BAD_SCHEDULE,
        "plain": periodic.Problem.NOT_RELIER,
        "bad-json": periodic.Problem.BAD_ENTRY,
    }


def test_with_the_setting_off_no_row_is_read(settings, redis_client):
    celery_beat.source.forget()
    _row(every=1)
    entries, _ = periodic.read_entries(app)
    assert ENTRY not in [e.name for e in entries]


# -- manage.py check ------------------------------------------------------------------
def test_check_warns_when_celery_beats_database_scheduler_would_fire_the_rows_too(models_on):
    before = app.conf.beat_scheduler
    try:
        app.conf.beat_scheduler = "django_celery_beat.schedulers:DatabaseScheduler"
        (warning,) = checks.check_celery_beat_models()
        assert isinstance(warning, CheckWarning) and warning.id == "relier.W010"
        assert "twice" in warning.msg and "relier_django.beat:DatabaseScheduler" in warning.hint
        app.conf.beat_scheduler = "relier_django.beat:DatabaseScheduler"
        assert checks.check_celery_beat_models() == []
    finally:
        app.conf.beat_scheduler = before


def test_check_refuses_the_setting_without_django_celery_beat_installed(models_on, settings):
    settings.INSTALLED_APPS = [a for a in settings.INSTALLED_APPS if a != "django_celery_beat"]
    (error,) = checks.check_celery_beat_models()
    assert isinstance(error, Error) and error.id == "relier.E017"


def test_relier_database_scheduler_leaves_rl_task_rows_to_relier(models_on):
    from relier_django import beat

    scheduler = beat.DatabaseScheduler
    assert scheduler.__name__ == "DatabaseScheduler" and issubclass(scheduler, beat._RelierEntries)
    assert beat._is_relier(app, "demo.sync_record") and not beat._is_relier(
        app, "demo.plain_record"
    )


def test_a_crontab_without_a_timezone_of_its_own_is_read_in_the_apps():
    schedule = ticks.parse_schedule(crontab(minute="*/5"), app.timezone)
    assert isinstance(schedule, ticks.Cron) and schedule.tz == app.timezone
