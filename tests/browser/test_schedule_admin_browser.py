"""Issue 21 in a real browser: an operator goes from the admin index to the Relier
section, opens "Scheduled tasks" (earliest due first, a hostile argument shown as text,
never run) and "Periodic entries" (schedule, last tick and its outcome, next tick).
Screenshots go to test-artifacts/."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
from playwright.sync_api import Page, expect

from relier_django.core.model import config
from relier_django.core.schedule import periodic
from relier_django.core.store.keys import KeySpace
from testproject.celery import app
from testproject.demo import tasks
from testproject.harness import REPO_ROOT

T = TypeVar("T")
XSS = "<script>alert(1)</script>"
PASSWORD = "correct horse battery staple"
ARTIFACTS = Path(REPO_ROOT) / "test-artifacts"


def off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn`` in a plain thread: ``push`` refuses to run beside Playwright's loop."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args, **kwargs).result()


def later(label: str, seconds: float) -> str:
    return tasks.sync_record.push_with(countdown=seconds, on_commit=False).push(label).task_id


@pytest.fixture
def beat_schedule() -> Iterator[dict[str, Any]]:
    before = app.conf.beat_schedule
    app.conf.beat_schedule = {
        "refresh-rates": {"task": "demo.sync_record", "schedule": 60.0, "args": ("rates",)}
    }
    try:
        yield app.conf.beat_schedule
    finally:
        app.conf.beat_schedule = before


def test_an_operator_sees_what_is_scheduled_and_the_periodic_entries(
    live_server, page: Page, redis_client, beat_schedule, django_user_model
):
    ids = [off_loop(later, XSS, 30), off_loop(later, "invoice-1842", 3600)]
    seconds, micros = redis_client.time()
    now = int(seconds) * 1000 + int(micros) // 1000
    tick = now // 60_000 * 60_000
    redis_client.hset(KeySpace("rl").periodic, "refresh-rates", tick - 60_000)
    off_loop(periodic.fire_due, app, config.current(), now)  # pushed; no worker: PENDING
    django_user_model.objects.create_superuser("operator", "operator@example.com", PASSWORD)
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))

    page.goto(f"{live_server.url}/admin/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.locator("#content-main .app-relier_django caption a").click()
    page.get_by_role("link", name="Scheduled tasks").click()

    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(2)  # the tick was due: queued at once, not scheduled
    expect(rows.nth(0)).to_contain_text(ids[0])
    expect(rows.nth(0).locator(".field-arguments")).to_have_text(repr(XSS))
    expect(rows.nth(1)).to_contain_text("'invoice-1842'")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "scheduled-admin.png"), full_page=True)

    page.get_by_role("link", name="Periodic entries").click()
    row = page.locator("#result_list tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("refresh-rates")
    expect(row.locator(".field-schedule")).to_have_text("every 1m")
    expect(row.locator(".field-outcome")).to_have_text("PENDING")
    expect(row.locator(".field-last")).to_contain_text(periodic.tick_id("refresh-rates", tick))
    page.screenshot(path=str(ARTIFACTS / "periodic-admin.png"), full_page=True)
    assert dialogs == []
