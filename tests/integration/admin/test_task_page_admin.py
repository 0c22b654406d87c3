"""The admin's task page (docs/admin-overview.md): the overview's running and queued
tasks link to a page each showing the task as the store holds it (state as the live
view names it, fence, attempt, worker, times) and its incarnation history; a
dead-lettered task redirects to its DLQ entry, a finished one names its outcome's
status, an unknown id is a 404 inside the admin. Caller-chosen ids are escaped and
survive the round trip through the URL. Django's test client against the session's
private Redis; the state is made by real acts (the producer's push, dead_letter.lua, a
real worker running a task, a death handed off and resurrected)."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from relier_django.core.model import config
from relier_django.core.model.envelope import decode
from relier_django.core.push import producer
from relier_django.core.recovery.resurrector import Resurrector
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from relier_django.core.worker import fencing
from relier_django.readers import tasks as task_reader
from testproject.celery import app
from testproject.demo import tasks
from testproject.harness import wait_until
from tests.dlq_entries import fail

pytestmark = pytest.mark.django_db

OVERVIEW = "admin:relier_django_deadletter_overview"
TASK = "admin:relier_django_deadletter_task"
DETAIL = "admin:relier_django_deadletter_detail"
HOSTILE = "<script>alert(1)</script>"


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


def push(label: str, task_id: str | None = None) -> str:
    """The real producer, sending at once to a queue no worker reads."""
    spec = tasks.sync_record.relier_spec
    receipt = producer.push(
        spec, app, (label,), {}, queue="parked", task_id=task_id, on_commit=False
    )
    return receipt.task_id


def field(page: str, name: str) -> str:
    """The text of one row of the page's task summary (``<td id="task-<name>">``)."""
    found = re.search(rf'<td id="task-{name}">(.*?)</td>', page, re.S)
    assert found, f"no task-{name} on the page"
    return html.unescape(found.group(1))


def events(page: str) -> list[str]:
    return re.findall(r'<td class="field-event">([^<]*)</td>', page)


def test_the_task_page_needs_staff_with_the_view_permission(client, login, redis_client):
    url = reverse(TASK, args=[push("p")])
    response = client.get(url)
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    login()  # staff without the permission
    assert client.get(url).status_code == 403
    login("manage_dlq")  # the manage permission alone opens nothing
    assert client.get(url).status_code == 403
    login("view_dlq")
    response = client.get(url)
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"] and "max-age=0" in response["Cache-Control"]
    assert client.post(url).status_code == 405


def test_a_pushed_task_shows_queued_with_fence_1_and_its_history_linked_from_the_overview(
    client, login, redis_client
):
    task_id = push("waiting")
    later = tasks.sync_record.push_with(countdown=3600, on_commit=False).push("later").task_id
    login("view_dlq")
    overview = client.get(reverse(OVERVIEW)).content.decode()
    url = reverse(TASK, args=[task_id])
    assert f'<a href="{url}">{task_id}</a>' in overview  # the waiting list links to it
    response = client.get(url)
    page = response.content.decode()
    assert response.status_code == 200
    assert field(page, "id") == task_id and field(page, "state") == "queued"
    assert (field(page, "name"), field(page, "queue")) == ("demo.sync_record", "parked")
    assert (field(page, "fence"), field(page, "attempt"), field(page, "worker")) == ("1", "1", "-")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", field(page, "created"))
    assert field(page, "started") == "-" and field(page, "due") == "-"
    # Its history, as the store holds it: no incarnation has started yet.
    assert 'id="task-history"' in page and events(page) == []
    assert "No event recorded yet" in page
    # Due in an hour: scheduled, with its due time.
    scheduled = client.get(reverse(TASK, args=[later])).content.decode()
    assert field(scheduled, "state") == "scheduled" and field(scheduled, "due").endswith(" UTC")


def test_a_task_a_real_worker_runs_shows_running_with_its_worker_and_start_event(
    client, login, worker, redis_client
):
    receipt = tasks.sync_record.push_with(on_commit=False).push("slow", 4)

    def running() -> bool:
        found = task_reader.unfinished(receipt.task_id)
        return found is not None and found.state == "running"

    wait_until(running, 30, what="the worker to start the task")
    login("view_dlq")
    overview = client.get(reverse(OVERVIEW)).content.decode()
    url = reverse(TASK, args=[receipt.task_id])
    running_list = overview[overview.index('id="overview-running"') :]
    assert f'<a href="{url}">{receipt.task_id}</a>' in running_list
    page = client.get(url).content.decode()
    assert field(page, "state") == "running" and field(page, "fence") == "1"
    assert field(page, "worker").startswith(worker.hostname)
    assert field(page, "started").endswith(" UTC")
    assert events(page) == ["start"]
    start = re.search(r'<td class="field-event">start</td>\s*<td class="field-fence">1</td>', page)
    assert start and worker.hostname in page[start.end() :]
    # Committed: the page names the outcome's status, never the result.
    assert receipt.get(timeout=30)["label"] == "slow"
    response = client.get(url)
    done = response.content.decode()
    assert response.status_code == 200 and 'id="task-finished"' in done
    assert '<strong id="task-outcome">SUCCESS</strong>' in done and "committed" in done
    assert "RESULT_TTL_S" in done and "task-history" not in done


def test_a_dead_lettered_task_redirects_to_its_dlq_entry(client, login, redis_client):
    env = fail(tasks.record, "d")
    login("view_dlq")
    response = client.get(reverse(TASK, args=[env.id]))
    assert response.status_code == 302
    assert response["Location"] == reverse(DETAIL, args=[env.id])
    assert client.get(response["Location"]).status_code == 200


def test_an_unknown_id_is_a_404_inside_the_admin(client, login, redis_client):
    login("view_dlq")
    response = client.get(reverse(TASK, args=["never-pushed"]))
    page = response.content.decode()
    assert response.status_code == 404
    assert 'id="task-unknown"' in page and "<code>never-pushed</code>" in page
    assert 'id="site-name"' in page  # the admin's look, not Django's bare 404


def test_a_hostile_task_id_is_escaped_and_its_link_opens_its_page(client, login, redis_client):
    odd = f"{HOSTILE}a/b?c#d%41&e"  # no blank: push refuses one (model.ids)
    push("odd", task_id=odd)
    login("view_dlq")
    overview = client.get(reverse(OVERVIEW)).content.decode()
    link = re.search(r'<th class="field-task-id"><a href="([^"]+)">', overview)
    assert link, "the task id is not linked"
    response = client.get(html.unescape(link.group(1)))  # the href, as a browser follows it
    page = response.content.decode()
    assert response.status_code == 200 and field(page, "id") == odd
    assert HOSTILE not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    unknown = client.get(reverse(TASK, args=[HOSTILE])).content.decode()
    assert HOSTILE not in unknown and "&lt;script&gt;alert(1)&lt;/script&gt;" in unknown


def causes_of_death(page: str) -> list[tuple[str, str, str]]:
    """(event, fence, cause) of each history row with a cause of death."""
    rows = re.findall(
        r'<td class="field-event">([^<]*)</td>\s*<td class="field-fence">([^<]*)</td>\s*'
        r'<td class="field-worker">[^<]*</td>\s*<td class="field-cause">([^<]*)</td>',
        page,
    )
    return [row for row in rows if row[2]]


def test_the_task_page_shows_the_cause_of_each_death_in_its_history(client, login, redis_client):
    cfg = config.current()
    store = sync_client(cfg)
    keys = KeySpace.of(cfg)
    task_id = push("died")
    env = decode(store.hget(keys.task(task_id), "env"))
    # Its pool process OOM-killed, as its worker's main process reports it; the scanner
    # brings it back (sync_record's limit is the setting's, 3).
    assert fencing.start(keys, env, "w1@host:1", 60_000).run(store).started
    assert fencing.handoff(keys, [(task_id, 1)], "running", "pool_death", death="oom").run(store)
    assert Resurrector(app, cfg, "s").run_pass().outcomes == {"resurrected": 1}

    login("view_dlq")
    page = client.get(reverse(TASK, args=[task_id])).content.decode()
    assert '<th scope="col">Cause of death</th>' in page
    assert causes_of_death(page) == [("expired", "1", "oom")]
    assert field(page, "fence") == "2"
