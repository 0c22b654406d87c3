"""G5 end to end through the admin (docs/dlq-admin.md): a task fails on a real worker and
lands in the DLQ; an operator logs in, finds it from the admin index, reads its
traceback (the hostile argument shown as text, never run), fixes the cause, releases
it with one confirmed click, and the task runs exactly once more and succeeds.

Screenshots go to test-artifacts/; with RELIER_UPDATE_DOCS_SCREENSHOTS=1 the list's is
also copied to docs/img/dlq-admin.png.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
from playwright.sync_api import Page, expect

from relier_django import TaskFailed
from relier_django.core.dlq import dead_letter as dlq
from relier_django.core.model import config
from relier_django.core.model.failure import Failure, Reason
from relier_django.core.push import idempotency, producer
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from testproject.demo import tasks
from testproject.harness import REPO_ROOT

T = TypeVar("T")

XSS = "<script>alert(1)</script>"
LABEL = "browser-1"
PASSWORD = "correct horse battery staple"
ARTIFACTS = Path(REPO_ROOT) / "test-artifacts"
DOCS_IMAGE = Path(REPO_ROOT) / "docs" / "img" / "dlq-admin.png"


def off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn`` in a plain thread. Playwright's sync API keeps an event loop running
    in this one, and ``push``/``receipt.get`` refuse to block a running loop."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args, **kwargs).result()


def fabricate_neighbours() -> None:
    """A few other entries, so the list looks like a real one: written with the core's
    scripts (stored, never sent), so the worker never sees them."""
    cfg = config.current()
    keys, client = KeySpace.of(cfg), sync_client(cfg)
    failed = (
        (tasks.charge, ("order-1842", 4900), Reason.EXCEPTION, "KeyError", "'currency'"),
        (tasks.flaky, ("nightly-sync", 9), Reason.RETRIES_EXHAUSTED, "TimeoutError",
         "run 4 of nightly-sync timed out"),
        (tasks.sync_record, ("report-q3",), Reason.HARD_TIMEOUT, "HardTimeout",
         "ran longer than 30 s"),
    )  # fmt: skip
    for task, args, reason, exc_type, message in failed:
        env = producer.prepare(task.relier_spec, args, {}, None)
        assert idempotency.store(keys, env, env.encode(), 60_000, 3).run(client).stored
        trace = f'Traceback (most recent call last):\n  File "tasks.py"\n{exc_type}: {message}'
        failure = Failure(reason, exc_type, message, traceback=trace, worker="celery@web-2")
        assert dlq.dead_letter(keys, failure, 60_000, env=env, held="queued").run(client).accepted
    malformed = Failure(Reason.MALFORMED_MESSAGE, "EnvelopeError", "not JSON")
    call = dlq.dead_letter(keys, malformed, 60_000, env=None, raw="{oops", queue="celery")
    assert call.run(client).accepted


def screenshot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    return path


def test_an_operator_releases_a_fixed_task_from_the_admin_and_it_runs_once_more(
    live_server, page: Page, worker, redis_client, django_user_model
):
    redis_client.set(f"demo:broken:{LABEL}", "1")
    off_loop(fabricate_neighbours)
    receipt = off_loop(tasks.until_fixed.push, LABEL, note=XSS)
    with pytest.raises(TaskFailed):
        off_loop(receipt.get, timeout=60)
    django_user_model.objects.create_superuser("operator", "operator@example.com", PASSWORD)
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))

    page.goto(f"{live_server.url}/admin/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    section = page.locator("#content-main .app-relier_django")
    expect(section).to_contain_text("Relier")
    section.get_by_role("link", name="Dead-letter queue").click()

    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(5)
    expect(rows.first).to_contain_text(receipt.task_id)
    page.click("#toggle-nav-sidebar")  # the admin's own toggle: room for the table
    screenshot(page, "dlq-admin-list.png")

    page.get_by_role("link", name=receipt.task_id).click()
    error = f"ValueError: {LABEL} is broken ({XSS})"
    expect(page.locator("pre.error")).to_have_text(error)
    expect(page.locator("pre.traceback")).to_contain_text("Traceback (most recent call last)")
    expect(page.locator("pre.traceback")).to_contain_text(error)
    expect(page.locator("pre.envelope")).to_contain_text(XSS)
    screenshot(page, "dlq-admin-detail.png")

    redis_client.delete(f"demo:broken:{LABEL}")  # the operator fixes the cause
    page.get_by_role("button", name="Release…").click()
    expect(page.locator("#confirm-list")).to_contain_text("Will be released.")
    page.get_by_role("button", name="Yes, release").click()
    expect(page.locator(".messagelist .success")).to_contain_text(
        f"Released 1 entry: {receipt.task_id}"
    )
    expect(rows).to_have_count(4)
    expect(page.locator("#result_list")).not_to_contain_text(receipt.task_id)

    result = off_loop(receipt.get, timeout=60)
    assert result["label"] == LABEL and result["runs"] == 2
    assert redis_client.llen(f"demo:exec:{LABEL}") == 2  # exactly once more
    assert dialogs == []  # the script in the argument and the error never ran

    if os.environ.get("RELIER_UPDATE_DOCS_SCREENSHOTS") == "1":
        DOCS_IMAGE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ARTIFACTS / "dlq-admin-list.png", DOCS_IMAGE)
