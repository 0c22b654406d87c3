"""The admin's Relier overview (docs/admin-overview.md): staff with the DLQ's view
permission see the cluster's figures as the store holds them (tasks in flight by state,
the DLQ, totals, the SLO windows, the last hour's charts, the tasks and periodic
entries); anyone else is sent to the login page or refused; Redis down is a readable
503. Django's test client against the session's private Redis: the state is made by
real acts (the producer's push, dead_letter.lua, a real worker committing)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from relier_django import metrics
from relier_django.core.model import config
from relier_django.core.push import producer
from relier_django.core.schedule import periodic
from relier_django.core.store.keys import KeySpace
from testproject.celery import app
from testproject.demo import tasks
from testproject.harness import wait_until
from tests.dlq_entries import fail, store

pytestmark = pytest.mark.django_db

OVERVIEW = "admin:relier_django_deadletter_overview"
LIST = "admin:relier_django_deadletter_changelist"
KEYS = KeySpace("rl")


@pytest.fixture
def login(client, django_user_model):
    """Log the test client in as staff holding the given relier_django permissions."""

    def as_user(*codenames: str) -> Any:
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


@pytest.fixture
def beat_schedule() -> Iterator[dict[str, Any]]:
    """The app's beat_schedule, empty, restored after the test."""
    before = app.conf.beat_schedule
    app.conf.beat_schedule = {}
    try:
        yield app.conf.beat_schedule
    finally:
        app.conf.beat_schedule = before


def push(label: str, queue: str | None = None, task_id: str | None = None) -> str:
    """The real producer, sending at once (the test runs inside a transaction)."""
    spec = tasks.sync_record.relier_spec
    receipt = producer.push(spec, app, (label,), {}, queue=queue, task_id=task_id, on_commit=False)
    return receipt.task_id


def in_flight(page: str) -> dict[str, int]:
    """The "In flight" table of the page: state -> count."""
    found = re.findall(
        r'<tr class="state-(\w+)"><th scope="row">.*?</th><td class="in-flight-count">(\d+)</td>',
        page,
    )
    return {state: int(n) for state, n in found}


def totals(page: str) -> dict[str, int]:
    found = re.findall(r'<tr><th scope="row">([^<]+)</th><td class="total">(\d+)</td></tr>', page)
    return {label: int(n) for label, n in found}


def bar_values(svg: str) -> list[int]:
    """A bar chart's values, one a minute of the last hour."""
    return [int(v) for v in re.findall(r'class="bar"[^>]*data-value="(\d+)"', svg)]


def now_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_the_overview_needs_staff_with_the_view_permission(client, login, redis_client):
    response = client.get(reverse(OVERVIEW))
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    login()  # staff without the permission
    assert client.get(reverse(OVERVIEW)).status_code == 403
    assert reverse(OVERVIEW) not in client.get("/admin/relier_django/").content.decode()
    login("manage_dlq")  # the manage permission alone opens nothing
    assert client.get(reverse(OVERVIEW)).status_code == 403
    login("view_dlq")
    assert client.get(reverse(OVERVIEW)).status_code == 200
    index = client.get("/admin/relier_django/").content.decode()
    assert f'href="{reverse(OVERVIEW)}"' in index
    scheduled = client.get(reverse("admin:relier_django_deadletter_scheduled")).content.decode()
    assert f'href="{reverse(OVERVIEW)}"' in scheduled  # the Relier pages link to it


def test_a_non_staff_user_is_sent_to_the_login_page(client, django_user_model, redis_client):
    user = django_user_model.objects.create_user("member", password="pw", is_staff=False)
    user.user_permissions.add(
        Permission.objects.get(content_type__app_label="relier_django", codename="view_dlq")
    )
    client.force_login(user)
    response = client.get(reverse(OVERVIEW))
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


def test_the_overview_shows_what_is_in_flight_the_dlq_and_no_leader_without_workers(
    client, login, redis_client
):
    hostile = "<script>alert(1)</script>"
    queued = [push(f"q{i}", queue="parked") for i in range(3)]
    queued.append(push("odd id", queue="parked", task_id=hostile))
    tasks.sync_record.push_with(countdown=3600, on_commit=False).push("later")
    dead = [fail(tasks.record, f"d{i}") for i in range(2)]
    login("view_dlq")
    response = client.get(reverse(OVERVIEW))
    page = response.content.decode()
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"] and "max-age=0" in response["Cache-Control"]
    assert in_flight(page) == {
        "queued": 4, "reserved": 0, "running": 0, "scheduled": 1, "recovering": 0,
    }  # fmt: skip
    # The DLQ: its size, linked to its list; filed in all, by reason; the minute's inflow.
    assert f'<a href="{reverse(LIST)}" id="dlq-link">2 entries</a>' in page
    assert totals(page)["Dead-lettered"] == 2 and "dead-lettered: exception" in page
    assert sum(bar_values(response.context["charts"]["dlq_inflow"])) == 2
    assert totals(page)["Pushed"] == 7  # 4 queued, 1 scheduled, 2 stored then dead-lettered
    # No worker, so no scanner: the page says so, plainly.
    assert 'id="no-leader"' in page and "NO LEADER" in page
    assert re.search(r'id="workers-alive">0<', page)
    # Each queued task is listed with its state, fence and no worker; ids are text.
    listed = [row["task"] for row in response.context["task_lists"][1][2]]
    assert {t.task_id for t in listed} == set(queued)
    assert {(t.state, t.fence, t.worker) for t in listed} == {("queued", 1, "")}
    assert hostile not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert not any(e.id in page for e in dead)  # DLQ entries are the DLQ list's
    # Three charts, inline SVG in the page itself: no script, no asset to fetch.
    assert page.count('<svg xmlns="http://www.w3.org/2000/svg" class="relier-chart') == 3
    assert 'aria-label="Tasks committed per minute, last hour"' in page
    assert client.post(reverse(OVERVIEW)).status_code == 405


def test_a_task_whose_id_holds_a_newline_from_before_ids_were_checked_is_listed_and_opens(
    client, login, redis_client
):
    # push() refuses such an id now (model.ids); a task stored before that is listed
    # and linked to its own page, which opens, instead of failing the whole overview.
    env = store(tasks.sync_record, "legacy", raw_id="order-1\nforged")
    login("view_dlq")
    response = client.get(reverse(OVERVIEW))
    assert response.status_code == 200
    (row,) = [r for r in response.context["task_lists"][1][2] if r["task"].task_id == env.id]
    assert "/overview/task/order-1%0Aforged/" in row["url"]
    page = client.get(row["url"])
    assert page.status_code == 200 and "order-1\nforged" in page.content.decode()


def test_a_real_worker_commits_and_the_overview_counts_it_with_the_periodic_ticks(
    client, login, worker, redis_client, beat_schedule
):
    beat_schedule.update({
        "ok-every-minute": {"task": "demo.sync_record", "schedule": 60.0, "args": ("tick",)},
        "boom": {"task": "demo.explode", "schedule": 60.0, "args": ("tick",)},
    })  # fmt: skip
    tick = now_ms(redis_client) // 60_000 * 60_000
    for name in beat_schedule:  # last recorded the minute before: this minute's tick is due
        redis_client.hset(KEYS.periodic, name, tick - 60_000)
    periodic.fire_due(app, config.current(), now_ms(redis_client))
    receipts = [tasks.sync_record.push_with(on_commit=False).push(f"c{i}") for i in range(3)]
    assert [r.get(timeout=30)["label"] for r in receipts] == ["c0", "c1", "c2"]

    def settled() -> bool:
        f = metrics.read()
        done = (f.counters["committed"], sum(f.dead_lettered.values())) == (4, 1)
        return done and bool(f.leader) and len(f.live.workers) == 1

    wait_until(settled, 30, what="4 commits, the failed tick filed, the worker and its scanner")
    login("view_dlq")
    response = client.get(reverse(OVERVIEW))
    page = response.content.decode()
    assert response.status_code == 200
    assert totals(page)["Committed"] == 4 and totals(page)["Dead-lettered"] == 1
    assert 'id="no-leader"' not in page
    leader = metrics.read().leader
    assert f'<td id="scanner-leader">{leader}</td>' in page
    assert int(re.search(r'id="workers-alive">(\d+)<', page).group(1)) == 1
    assert worker.name in page  # the worker's id, in the list of live workers
    # The last hour: 4 committed and 1 dead-lettered, in this minute (or the one before).
    values = bar_values(response.context["charts"]["throughput"])
    assert len(values) == 60 and sum(values) == 4
    one_hour = next(w for w in response.context["slo"] if w["name"] == "1h")
    assert (one_hour["committed"], one_hour["dead_lettered"]) == (4, 1)
    # Periodic entries: the last outcome and the next tick; a failed tick links to its entry.
    rows = {r["entry"].name: r for r in response.context["periodic"]}
    assert rows["ok-every-minute"]["entry"].last_outcome == "SUCCESS"
    assert rows["ok-every-minute"]["dlq_url"] is None
    boom_id = periodic.tick_id("boom", tick)
    detail = reverse("admin:relier_django_deadletter_detail", args=[boom_id])
    assert rows["boom"]["dlq_url"] == detail and f'<a href="{detail}">FAILURE</a>' in page
    assert client.get(detail).status_code == 200
    assert rows["boom"]["entry"].next_tick_ms > tick


def test_the_overview_lists_the_newest_workflows_with_their_state(
    client, login, redis_client, django_capture_on_commit_callbacks
):
    from celery import chain

    login("view_dlq")
    add = tasks.step_add
    with django_capture_on_commit_callbacks(execute=True):  # the test's transaction
        last = chain(add.s(1, 2), add.s(3), add.s(4)).apply_async()  # no worker: pending
    first = last.parent.parent.id
    page = client.get(reverse(OVERVIEW)).content.decode()
    rows = re.findall(r'<tr class="workflow-row">(.*?)</tr>', page, re.S)
    assert len(rows) == 1 and f"<code>{first}</code>" in rows[0]
    assert '<td class="field-kind">chain</td>' in rows[0]
    assert '<td class="field-state">PENDING</td>' in rows[0]
    assert '<td class="field-done">0 / 3</td>' in rows[0]
