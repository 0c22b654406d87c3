"""Issue 27 in a real browser: with the admin's navigation sidebar open, the DLQ list
shows every column clear of the filter panel, none under it, and a long error, task
name or entry id stays readable, at 1400 px (where the FAILURES column used to
disappear under the filter), at 1024 px (where the filter goes below the list) and at
1920 px.

Entries are fabricated with the core's scripts, no worker needed. Screenshots go to
test-artifacts/.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
from playwright.sync_api import FloatRect, Locator, Page, expect

from relier_django.core.model.failure import Reason
from testproject.demo import tasks
from testproject.harness import REPO_ROOT
from tests.dlq_entries import fail, untied

T = TypeVar("T")
PASSWORD = "correct horse battery staple"
ARTIFACTS = Path(REPO_ROOT) / "test-artifacts"

# What made the table too wide for the space beside the filter: long words that cannot
# break (a caller-chosen task id, a dotted task name, a URL in an error message).
LONG_ID = "invoice-reconciliation-2024-09-30-customer-8f3a2b1c-4d5e-6f70-8192-a3b4c5d6e7f8"
LONG_TASK = "billing.invoices.tasks.reconcile_ledger_with_the_payment_provider_nightly"
LONG_ERROR = (
    "could not reach https://payments.example.com/v2/customers/cus_8f3a2b1c4d5e6f70/"
    "invoices?expand=lines,discounts,tax_amounts&limit=100 after 30 s (attempt 4 of 4)"
)


def off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn`` in a plain thread: the store refuses to block Playwright's loop."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args, **kwargs).result()


def fabricate() -> None:
    # 84 characters: longer than push now lets a caller choose (model.ids), as an entry
    # stored before that check may be; the list must still show it whole.
    fail(tasks.record, "a", reason=Reason.RETRIES_EXHAUSTED, message=LONG_ERROR, raw_id=LONG_ID)
    fail(tasks.sync_record, "b", reason=Reason.RESULT_NOT_SERIALIZABLE, message="short")
    untied(task=LONG_TASK, reason=Reason.SCHEMA_MIGRATION)


def box(locator: Locator) -> FloatRect:
    found = locator.bounding_box()
    assert found is not None, f"{locator} is not rendered"
    return found


def overlaps(a: FloatRect, b: FloatRect) -> bool:
    return (
        a["x"] < b["x"] + b["width"]
        and b["x"] < a["x"] + a["width"]
        and a["y"] < b["y"] + b["height"]
        and b["y"] < a["y"] + a["height"]
    )


def clipped(locator: Locator) -> bool:
    """Whether the element's content is wider than the element shows."""
    return bool(locator.evaluate("el => el.scrollWidth > el.clientWidth + 1"))


@pytest.mark.parametrize("width", [1400, 1024, 1920])
def test_every_column_of_the_dlq_list_is_clear_of_the_filter_with_the_sidebar_open(
    live_server, page: Page, redis_client, django_user_model, width: int
):
    off_loop(fabricate)
    django_user_model.objects.create_superuser("operator", "operator@example.com", PASSWORD)
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{live_server.url}/admin/relier_django/deadletter/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(3)
    expect(page.locator("#nav-sidebar")).to_be_visible()  # open: the admin's default
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"dlq-admin-list-{width}.png"), full_page=True)

    filters = box(page.locator("#changelist-filter"))
    results = page.locator("#changelist .results")
    assert not clipped(results), "the table needs a horizontal scroll"
    shown = box(results)
    header = page.locator("#result_list thead th").last
    expect(header).to_have_text("Failures")
    cells = [header, *page.locator("#result_list .field-failures").all()]
    for cell in [*cells, *page.locator("#result_list .field-reason").all()]:
        expect(cell).to_be_visible()
        at = box(cell)
        assert not overlaps(at, filters), f"{cell.inner_text()!r} is under the filter"
        assert shown["x"] <= at["x"] and at["x"] + at["width"] <= shown["x"] + shown["width"]
        assert at["x"] + at["width"] <= width, "off the window"

    long = rows.filter(has_text=LONG_ID)
    expect(long.locator(".field-failures")).to_have_text("1")
    expect(long.locator(".field-reason")).to_have_text("retries_exhausted")
    error = long.locator(".field-error")  # shown whole, wrapped, not cut
    assert LONG_ERROR in error.inner_text() and not clipped(error)
    for cell in (long.locator(".field-id"), long.locator(".field-reason")):
        assert not clipped(cell), f"{cell.inner_text()!r} is cut"
    assert not clipped(rows.filter(has_text=LONG_TASK).locator(".field-task"))
