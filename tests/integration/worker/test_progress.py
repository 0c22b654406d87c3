"""Progress (docs/progress.md): a running task's ``ctx.set_progress`` /
``self.update_state`` is its Celery state and info, read from another process than the
worker (``AsyncResult`` through ``RelierBackend``, a receipt), shown on the admin's
task page and in the live view; it is stored fenced (G2: a zombie cannot overwrite
its successor's), kept across a resurrection, and gives way to the outcome at commit.
Real workers on the session's private Redis; the demo tasks are
testproject/demo/progress_tasks.py."""

from __future__ import annotations

import html
import re
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery.result import AsyncResult
from django.contrib.auth.models import Permission
from django.urls import reverse

from relier_django.core.broker import publish
from relier_django.core.model.envelope import decode
from relier_django.core.observe import live
from relier_django.core.push import eager
from relier_django.core.store import progress as store_progress
from relier_django.core.store.keys import KeySpace
from testproject.celery import app
from testproject.demo import progress_tasks
from testproject.harness import wait_until

KEYS = KeySpace("rl")
BACKEND = "relier_django.results:RelierBackend"
FAST = {
    "RELIER_HEARTBEAT_TTL_S": "1.5",
    "RELIER_SCAN_INTERVAL_S": "0.3",
    "RELIER_LEADER_LEASE_S": "2",
}


@pytest.fixture
def relier_results() -> Iterator[None]:
    """This process's Celery app reading results through RelierBackend (no fallback:
    only relier's tasks are read)."""
    before = app.conf.result_backend
    app.conf.result_backend = BACKEND
    app._backend_cache = None
    vars(app._local).pop("backend", None)
    try:
        yield
    finally:
        app.conf.result_backend = before
        app._backend_cache = None
        vars(app._local).pop("backend", None)


def log(client: redis.Redis, run: str) -> list[str]:
    return [
        e.decode() if isinstance(e, bytes) else e
        for e in client.lrange(f"demo:progress:{run}", 0, -1)
    ]


def logged(client: redis.Redis, run: str, entry: str) -> None:
    wait_until(lambda: entry in log(client, run), 30, what=f"{entry} in {run}'s log")


def open_gate(client: redis.Redis, run: str, fence: int) -> None:
    client.set(f"demo:progress:{run}:go:{fence}", "1")


@pytest.mark.parametrize(
    "task", [progress_tasks.steps, progress_tasks.asteps], ids=["update_state", "aset_progress"]
)
def test_a_running_task_s_progress_is_its_state_and_info_in_another_process(
    task, relier_results, worker, redis_client
):
    run = f"mid-{task.name}"
    receipt = task.push(run)
    logged(redis_client, run, "reported:1")

    found = AsyncResult(receipt.task_id)
    assert (found.state, found.info) == ("PROGRESS", {"step": "first", "fence": 1})
    assert not found.ready()
    assert (receipt.state, receipt.info) == ("PROGRESS", {"step": "first", "fence": 1})

    open_gate(redis_client, run, 1)
    assert receipt.get(timeout=30) == {"run": run, "fence": 1}
    # Committed: the outcome is what readers see, and the progress went with the task.
    done = AsyncResult(receipt.task_id)
    assert (done.state, done.info) == ("SUCCESS", {"run": run, "fence": 1})
    assert receipt.info == {"run": run, "fence": 1}
    assert not redis_client.exists(KEYS.task(receipt.task_id))


def test_a_zombie_cannot_overwrite_the_progress_of_the_incarnation_that_superseded_it(
    relier_results, worker, redis_client
):
    run = "zombie"
    receipt = progress_tasks.steps.push(run)
    logged(redis_client, run, "reported:1")

    # What a resurrection does while fence 1 still runs: mint fence 2 and re-dispatch.
    task_key = KEYS.task(receipt.task_id)
    old = decode(redis_client.hget(task_key, "env"))
    nxt = old.next_incarnation(resurrections=1)
    redis_client.hset(
        task_key, mapping={"fence": nxt.fence, "state": "queued", "env": nxt.encode()}
    )
    publish.send(app, nxt)
    logged(redis_client, run, "reported:2")
    assert AsyncResult(receipt.task_id).info == {"step": "first", "fence": 2}

    open_gate(redis_client, run, 1)  # the zombie reports again: refused by progress.lua
    logged(redis_client, run, "refused:1")
    assert AsyncResult(receipt.task_id).info == {"step": "first", "fence": 2}
    assert "second:1" not in log(redis_client, run)

    open_gate(redis_client, run, 2)
    assert receipt.get(timeout=30) == {"run": run, "fence": 2}


def test_progress_is_kept_across_a_resurrection(relier_results, worker_factory, redis_client):
    worker_factory(extra_env=FAST)
    run = "resurrected"
    receipt = progress_tasks.dies_once.push(run)
    wait_until(lambda: any(e.startswith("resumed:") for e in log(redis_client, run)), 60,
               what="the resurrected incarnation")  # fmt: skip
    fence = int(next(e for e in log(redis_client, run) if e.startswith("resumed:")).split(":")[1])
    assert fence >= 2
    # The new incarnation reported nothing yet: readers see what its predecessor reported.
    found = AsyncResult(receipt.task_id)
    assert (found.state, found.info) == ("PROGRESS", {"done": 1, "fence": 1})

    open_gate(redis_client, run, fence)
    assert receipt.get(timeout=30) == {"run": run, "fence": fence}


@pytest.mark.django_db
def test_the_task_page_and_the_live_view_show_a_running_task_s_progress(
    client, django_user_model, worker, redis_client
):
    run = "shown"
    receipt = progress_tasks.steps.push_with(on_commit=False).push(run)
    logged(redis_client, run, "reported:1")

    listed = live.scan(redis_client, KEYS, 0).tasks
    (shown,) = [t for t in listed if t.task_id == receipt.task_id]
    assert shown.progress == store_progress.Progress("PROGRESS", {"step": "first", "fence": 1})
    assert shown.to_json()["progress"] == {
        "state": "PROGRESS",
        "meta": {"step": "first", "fence": 1},
    }

    user = django_user_model.objects.create_user("staff", password="pw", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(content_type__app_label="relier_django", codename="view_dlq")
    )
    client.force_login(user)
    page = client.get(reverse("admin:relier_django_deadletter_task", args=[receipt.task_id]))
    text = page.content.decode()
    row = re.search(r'<td id="task-progress">(.*?)</td>', text, re.S)
    assert row and html.unescape(row.group(1)) == 'PROGRESS {"fence":1,"step":"first"}'
    overview = client.get(reverse("admin:relier_django_deadletter_overview")).content.decode()
    assert "PROGRESS {&quot;fence&quot;:1,&quot;step&quot;:&quot;first&quot;}" in overview

    open_gate(redis_client, run, 1)
    receipt.get(timeout=30)


def test_an_eager_run_s_progress_is_read_from_memory_while_it_runs(relier_results, redis_client):
    eager.override(eager.Mode(eager=True))
    task_id = f"eager-{uuid.uuid4().hex}"
    receipts: list[Any] = []
    pushing = threading.Thread(
        target=lambda: receipts.append(
            progress_tasks.inline.apply_async(args=["eager", 30], task_id=task_id)
        )
    )
    try:
        pushing.start()
        wait_until(lambda: AsyncResult(task_id).state == "WORKING", 30, what="eager progress")
        assert AsyncResult(task_id).info == {"step": "first"}
        open_gate(redis_client, "eager", 1)  # an eager run holds fence 1, as a worker's
        pushing.join(30)
    finally:
        open_gate(redis_client, "eager", 1)
        pushing.join(30)
        eager.override(None)
    (receipt,) = receipts
    assert (receipt.status, receipt.info) == ("SUCCESS", {"run": "eager"})
    assert store_progress.recall(task_id) is None  # forgotten once the outcome is in
