"""Issue 21, seeing what is scheduled (docs/scheduling.md, "Seeing what is scheduled"):
``manage.py relier_scheduled list`` and the admin's "Scheduled tasks" page show what
waits in the schedule index, earliest due first, by cursor pages, filtered by task;
``relier_scheduled periodic`` and "Periodic entries" show each relier periodic entry's
schedule, last tick and its outcome, and next tick. Both only read; the admin pages need
the DLQ's view permission and show a readable 503 when Redis is down."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from relier_django import cancel, conf
from relier_django.core.model import config
from relier_django.core.model.timing import Timing
from relier_django.core.push import producer
from relier_django.core.schedule import listing, periodic
from relier_django.core.store.keys import KeySpace
from testproject.celery import app
from testproject.demo import tasks
from testproject.harness import wait_until

KEYS = KeySpace("rl")
SCHEDULED = "admin:relier_django_deadletter_scheduled"
PERIODIC = "admin:relier_django_deadletter_periodic"
XSS = "<script>alert(1)</script>"
TASK_KEYS = {
    "task_id", "task", "queue", "due_at", "due_ms", "state", "attempt", "expires_at", "args",
    "kwargs",
}  # fmt: skip
ENTRY_KEYS = {
    "name", "task", "schedule", "missed", "queue", "last_tick_at", "last_tick_task_id",
    "last_tick_outcome", "next_tick_at",
}  # fmt: skip


def later(label: str, seconds: float, **kwargs: Any) -> str:
    """Push ``demo.sync_record(label)`` due in ``seconds``; its task id."""
    push = tasks.sync_record.push_with(countdown=seconds, on_commit=False, **kwargs)
    return push.push(label).task_id


def at(label: str, eta: datetime) -> str:
    return tasks.sync_record.push_with(eta=eta, on_commit=False).push(label).task_id


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("relier_scheduled", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def run_json(*args: str) -> Any:
    return json.loads(run(*args, "--json"))


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


def _now_ms(client) -> int:  # type: ignore[no-untyped-def]
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


# -- manage.py relier_scheduled list -----------------------------------------------------


def test_list_shows_scheduled_tasks_earliest_due_first_with_their_arguments(redis_client):
    third, first, second = later("c", 300), later("a", 60), later("b", 120)
    queued = tasks.sync_record.apply_async(("q",), {"sleep_s": 0.5}, countdown=600, queue="slow")
    tasks.sync_record.push_with(on_commit=False).push("now")  # not scheduled: not listed
    page = run_json("list")
    assert set(page) == {"now", "total", "tasks", "next_cursor"}
    assert page["total"] == 4 and page["next_cursor"] is None
    ids = [t["task_id"] for t in page["tasks"]]
    assert ids == [first, second, third, queued.task_id]
    row = page["tasks"][-1]
    assert set(row) == TASK_KEYS
    assert row["task"] == "demo.sync_record" and row["queue"] == "slow"
    assert row["state"] == "scheduled" and row["attempt"] == 1 and row["expires_at"] is None
    assert row["args"] == ["q"] and row["kwargs"] == {"sleep_s": 0.5}
    due = redis_client.zscore(KEYS.schedule, queued.task_id)
    assert row["due_ms"] == int(due) and row["due_at"] == listing.iso(int(due))
    text = run("list")
    lines = text.splitlines()
    assert lines[0].split() == ["DUE", "(UTC)", "TASK", "ID", "TASK", "QUEUE", "ARGUMENTS"]
    assert [line.split()[2] for line in lines[1:5]] == [*ids]
    assert "'q', sleep_s=0.5" in lines[4] and "slow" in lines[4]
    assert "4 shown; 4 tasks scheduled in all" in text


YEAR_10031_MS = 254_402_214_400_000  # past every date Python's datetime holds


def stored_before_the_bound(label: str, when: Timing) -> str:
    """Push with ``when`` as given, past the bound ``timing()`` now enforces, as a push
    made before it could; its task id."""
    spec = tasks.sync_record.relier_spec
    return producer.push(spec, app, (label,), {}, when=when, on_commit=False).task_id


def test_a_task_stored_due_past_year_9999_is_listed_with_its_raw_time_and_fails_no_listing(
    redis_client,
):
    soon = later("soon", 60)
    year_10031 = stored_before_the_bound("far", Timing(eta_ms=YEAR_10031_MS))
    # 31 million years: Lua writes such a number in exponent form.
    huge = stored_before_the_bound("huge", Timing(countdown_ms=10**18, expires_in_ms=10**18))
    page = run_json("list")
    assert [t["task_id"] for t in page["tasks"]] == [soon, year_10031, huge]
    far_row, huge_row = page["tasks"][1:]
    assert far_row["due_at"] == f"{YEAR_10031_MS} ms since the epoch (out of range)"
    assert huge_row["due_ms"] >= 10**18 and huge_row["expires_at"].endswith("(out of range)")
    text = run("list")
    assert year_10031 in text and huge in text and "3 tasks scheduled in all" in text
    assert "(out of range)" in text
    view = listing.page(config.current())
    assert [t.task_id for t in view.tasks] == [soon, year_10031, huge]


def test_list_clips_long_arguments_and_says_when_nothing_is_scheduled(redis_client):
    assert run("list").strip() == "Nothing is scheduled."
    empty = run_json("list")
    assert empty == {"now": empty["now"], "total": 0, "tasks": [], "next_cursor": None}
    later("x" * 1000, 60)
    (line,) = [ln for ln in run("list").splitlines() if "demo.sync_record" in ln]
    arguments = line.split("demo.sync_record", 1)[1].strip()
    assert arguments.endswith("…") and len(arguments) <= listing.ARGS_REPR_LIMIT + 12
    assert run_json("list")["tasks"][0]["args"] == ["x" * 1000]  # --json: whole


def test_the_printed_cursor_pages_through_every_task_once_ties_included(redis_client):
    eta = datetime.now(UTC) + timedelta(hours=1)
    tied = {at(f"tie{i}", eta) for i in range(7)}  # one due time: ordered by id
    others = [later(f"o{i}", 60 + i) for i in range(4)] + [later("last", 7200)]
    seen: list[str] = []
    args = ["list", "--limit", "3"]
    while True:
        page = run_json(*args)
        assert len(page["tasks"]) <= 3
        seen += [t["task_id"] for t in page["tasks"]]
        if page["next_cursor"] is None:
            break
        args = ["list", "--limit", "3", "--cursor", page["next_cursor"]]
    assert seen == others[:4] + sorted(tied) + others[4:]
    assert "next page: --cursor " in run("list", "--limit", "3")


def test_task_filter_lists_only_that_task_and_a_bounded_scan_hands_back_a_cursor(
    redis_client, monkeypatch
):
    mine = [later(f"m{i}", 60 + i) for i in range(3)]
    for i in range(6):
        tasks.record.push_with(countdown=30 + i, on_commit=False).push(f"other{i}")
    page = run_json("list", "--task", "demo.sync_record")
    assert [t["task_id"] for t in page["tasks"]] == mine and page["total"] == 9
    assert run("list", "--task", "demo.nothing").strip() == "No task matches."
    # A filter reads at most SCAN_LIMIT tasks a page: fewer rows, and a cursor to go on.
    monkeypatch.setattr(listing, "SCAN_LIMIT", 4)
    cfg = conf.get_config()
    first = listing.page(cfg, task="demo.sync_record")
    assert first.tasks == () and first.next_cursor is not None
    pages, cursor = [], first.next_cursor
    while cursor is not None:
        rest = listing.page(cfg, cursor, task="demo.sync_record")
        pages.append([t.task_id for t in rest.tasks])
        cursor = rest.next_cursor
    assert pages == [mine[:2], mine[2:]]  # 2 others + 2 of mine read, then the last one


def test_a_task_that_leaves_the_schedule_leaves_the_listing(redis_client):
    gone, stays = later("gone", 60), later("stays", 120)
    cancel(gone)
    assert [t["task_id"] for t in run_json("list")["tasks"]] == [stays]


def test_bad_arguments_are_command_errors(redis_client):
    # An unreachable Redis is a CommandError too: tests/integration/admin/test_redis_down.py.
    with pytest.raises(CommandError, match="not a schedule cursor"):
        run("list", "--cursor", "nonsense")
    with pytest.raises(CommandError, match="from 1 to 500"):
        run("list", "--limit", "0")


# -- periodic entries --------------------------------------------------------------------


def test_periodic_shows_each_entrys_schedule_last_tick_outcome_and_next_tick(
    worker, redis_client, beat_schedule
):
    from celery.schedules import crontab

    beat_schedule.update({
        "ok-every-minute": {"task": "demo.sync_record", "schedule": 60.0, "args": ("tick",),
                            "options": {"queue": "celery"}},
        "boom": {"task": "demo.explode", "schedule": timedelta(minutes=1), "args": ("tick",),
                 "options": {"relier_missed": "once"}},
        "nightly": {"task": "demo.sync_record", "schedule": crontab(minute=30, hour=2),
                    "args": ("night",), "options": {"relier_missed": "skip"}},
        "plain": {"task": "demo.plain_record", "schedule": 5.0, "args": ("p",)},
    })  # fmt: skip
    cfg = config.current()
    now = _now_ms(redis_client)
    tick = now // 60_000 * 60_000
    for name in ("ok-every-minute", "boom"):  # last recorded: the minute before
        redis_client.hset(KEYS.periodic, name, tick - 60_000)
    periodic.fire_due(app, cfg, now)  # fires the minute's tick of both; seeds "nightly"
    redis_client.hdel(KEYS.periodic, "nightly")  # ... which a scanner has not seen yet

    def settled() -> bool:
        states = {e["name"]: e["last_tick_outcome"] for e in run_json("periodic")["entries"]}
        return states["ok-every-minute"] == "SUCCESS" and states["boom"] == "FAILURE"

    wait_until(settled, 30, what="both ticks' outcomes")
    view = run_json("periodic")
    assert set(view) == {"now", "entries", "not_fired"}
    entries = {e["name"]: e for e in view["entries"]}
    ok = entries["ok-every-minute"]
    assert set(ok) == ENTRY_KEYS
    assert ok == {
        "name": "ok-every-minute", "task": "demo.sync_record", "schedule": "every 1m",
        "missed": "all", "queue": "celery", "last_tick_at": listing.iso(tick),
        "last_tick_task_id": periodic.tick_id("ok-every-minute", tick),
        "last_tick_outcome": "SUCCESS", "next_tick_at": ok["next_tick_at"],
    }  # fmt: skip
    assert ok["next_tick_at"] in (listing.iso(tick + 60_000), listing.iso(tick + 120_000))
    assert entries["boom"]["missed"] == "once" and entries["boom"]["last_tick_outcome"] == "FAILURE"
    night = entries["nightly"]
    assert night["schedule"] == "crontab 30 2 * * * (UTC)" and night["missed"] == "skip"
    assert night["last_tick_at"] is None and night["last_tick_outcome"] is None
    assert night["next_tick_at"].endswith("T02:30:00.000Z")
    (plain,) = view["not_fired"]
    assert plain["name"] == "plain" and plain["problem"] == "not_relier"
    text = run("periodic")
    header, *rows = text.splitlines()
    assert header.split()[:4] == ["ENTRY", "TASK", "SCHEDULE", "MISSED"]
    ok_line = next(r for r in rows if r.startswith("ok-every-minute"))
    assert "SUCCESS" in ok_line and "every 1m" in ok_line
    assert "Not fired by relier:" in text and "plain:" in text


def test_periodic_with_no_relier_entry_says_so(redis_client, beat_schedule):
    assert run("periodic").strip() == "No periodic entry names an @rl_task."
    assert run_json("periodic")["entries"] == []


# -- the admin pages ---------------------------------------------------------------------


@pytest.fixture
def login(client, django_user_model):
    def as_user(*codenames: str):  # type: ignore[no-untyped-def]
        user = django_user_model.objects.create_user(
            f"staff{django_user_model.objects.count()}", password="pw", is_staff=True
        )
        for codename in codenames:
            user.user_permissions.add(
                Permission.objects.get(content_type__app_label="relier_django", codename=codename)
            )
        client.force_login(user)
        return user

    return as_user


@pytest.mark.django_db
def test_the_pages_need_staff_with_the_view_permission(client, login, redis_client):
    later("secret", 60)
    for name in (SCHEDULED, PERIODIC):
        response = client.get(reverse(name))
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    login()  # staff, no permission
    for name in (SCHEDULED, PERIODIC):
        assert client.get(reverse(name)).status_code == 403
    assert reverse(SCHEDULED) not in client.get("/admin/relier_django/").content.decode()
    login("manage_dlq")  # the manage permission alone opens nothing
    assert client.get(reverse(SCHEDULED)).status_code == 403


@pytest.mark.django_db
def test_scheduled_tasks_page_lists_by_due_time_escaped_paged_and_never_cached(
    client, login, redis_client, monkeypatch
):
    from relier_django.admin import schedule as admin_schedule

    ids = [later(f"l{i}", 60 + i) for i in range(3)]
    evil = later(XSS, 30)
    login("view_dlq")
    index = client.get("/admin/relier_django/").content.decode()
    assert f'href="{reverse(SCHEDULED)}"' in index and f'href="{reverse(PERIODIC)}"' in index
    response = client.get(reverse(SCHEDULED))
    page = response.content.decode()
    assert response.status_code == 200 and "no-cache" in response["Cache-Control"]
    positions = [page.index(i) for i in [evil, *ids]]
    assert positions == sorted(positions)  # earliest due first
    assert XSS not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "4 scheduled in all" in page
    assert client.post(reverse(SCHEDULED)).status_code == 405
    monkeypatch.setattr(admin_schedule, "PAGE_SIZE", 2)
    first = client.get(reverse(SCHEDULED)).context
    assert [r["task"].task_id for r in first["rows"]] == [evil, ids[0]]
    second = client.get(reverse(SCHEDULED) + first["next_page"]).context
    assert [r["task"].task_id for r in second["rows"]] == ids[1:]
    assert second["next_page"] is None and second["first_page"] == "?"
    filtered = client.get(reverse(SCHEDULED), {"task": "demo.record"}).content.decode()
    assert "No scheduled task of that name." in filtered


@pytest.mark.django_db
def test_the_scheduled_tasks_page_shows_a_task_due_past_year_9999_instead_of_failing(
    client, login, redis_client
):
    soon = later("soon", 60)
    far = stored_before_the_bound("far", Timing(eta_ms=YEAR_10031_MS, expires_in_ms=10**18))
    login("view_dlq")
    response = client.get(reverse(SCHEDULED))
    page = response.content.decode()
    assert response.status_code == 200 and soon in page and far in page
    assert f"{YEAR_10031_MS} ms since the epoch (out of range)" in page


@pytest.mark.django_db
def test_periodic_entries_page_shows_schedule_last_tick_and_next(
    client, login, redis_client, beat_schedule
):
    beat_schedule["every-minute"] = {"task": "demo.sync_record", "schedule": 60.0,
                                     "args": ("tick",)}  # fmt: skip
    beat_schedule["plain"] = {"task": "demo.plain_record", "schedule": 5.0, "args": ("p",)}
    now = _now_ms(redis_client)
    tick = now // 60_000 * 60_000
    redis_client.hset(KEYS.periodic, "every-minute", tick - 60_000)
    periodic.fire_due(app, config.current(), now)  # pushed, no worker: PENDING
    login("view_dlq")
    response = client.get(reverse(PERIODIC))
    page = response.content.decode()
    assert response.status_code == 200 and "no-cache" in response["Cache-Control"]
    (row,) = response.context["rows"]
    assert row["entry"].last_tick_ms == tick and row["entry"].last_outcome == "PENDING"
    for shown in ("every-minute", "every 1m", periodic.tick_id("every-minute", tick), "PENDING"):
        assert shown in page
    assert "Not fired by relier" in page and "plain" in page
