"""The admin overview in a real browser (docs/admin-overview.md): a real worker commits
tasks and brings back one whose pool process died, two tasks fail into the DLQ and two
wait on a queue no worker reads; an operator opens the overview from the Relier section
and sees the three charts of the last hour drawn (inline SVG, nothing fetched, no
script), the in-flight counts and the totals, opens a waiting task's page from its id,
then follows the DLQ link to its list.
Screenshots go to test-artifacts/."""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from playwright.sync_api import Page, expect

from relier_django import metrics
from relier_django.core.push import producer
from testproject.celery import app
from testproject.demo import tasks
from testproject.harness import REPO_ROOT, wait_until
from tests.dlq_entries import fail

T = TypeVar("T")
PASSWORD = "correct horse battery staple"
ARTIFACTS = Path(REPO_ROOT) / "test-artifacts"


def off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn`` in a plain thread: ``push`` refuses to run beside Playwright's loop."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args, **kwargs).result()


def make_a_known_state() -> None:
    """3 commits, 1 task resurrected after its pool process died (then committed),
    2 dead-lettered, 2 queued where no worker consumes."""
    for i in range(3):
        tasks.sync_record.push_with(on_commit=False).push(f"ok{i}").get(timeout=30)
    assert tasks.fragile.push("overview", 1).get(timeout=60)["runs"] == 2
    for i in range(2):
        fail(tasks.record, f"dead{i}")
    for i in range(2):
        producer.push(tasks.sync_record.relier_spec, app, (f"parked{i}",), {}, queue="parked")


def settled() -> bool:
    f = metrics.read()
    return (
        f.counters["committed"] == 4
        and f.recovery_all.count == 1
        and f.dlq_entries == 2
        and bool(f.leader)
        and len(f.live.workers) == 1
    )


def test_an_operator_sees_the_cluster_charts_and_follows_a_task_link_and_the_dlq_link(
    live_server, page: Page, worker, redis_client, django_user_model
):
    off_loop(make_a_known_state)
    off_loop(wait_until, settled, 30, what="the known state, the worker and its scanner")
    django_user_model.objects.create_superuser("operator", "operator@example.com", PASSWORD)
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    outside: list[str] = []  # any request the page makes beyond this server
    page.on(
        "request", lambda r: None if r.url.startswith(live_server.url) else outside.append(r.url)
    )

    page.goto(f"{live_server.url}/admin/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.locator("#content-main .app-relier_django caption a").click()
    page.get_by_role("link", name="Overview").click()
    expect(page).to_have_title("Relier overview | Django site admin")

    charts = page.locator("#overview-charts svg.relier-chart")
    expect(charts).to_have_count(3)
    for i in range(3):
        chart = charts.nth(i)
        expect(chart).to_be_visible()
        box = chart.bounding_box()
        assert box is not None and box["width"] > 100 and box["height"] > 50
    throughput, recovery, inflow = (charts.nth(i) for i in range(3))
    expect(throughput).to_have_attribute("aria-label", "Tasks committed per minute, last hour")
    heights = [float(h) for h in throughput.locator("rect.bar").evaluate_all(
        "bars => bars.map(b => b.getAttribute('height'))"
    )]  # fmt: skip
    assert len(heights) == 60 and sum(1 for h in heights if h > 0) in (1, 2)  # this minute
    expect(recovery.locator("circle.dot").first).to_be_visible()  # the resurrected task
    expect(recovery.locator("text.no-data")).to_have_count(0)
    # Two dead-lettered this minute (or one in each, across a minute's turn).
    expect(inflow.locator("text.axis-max")).to_have_text(re.compile(r"max [12] tasks/min"))

    in_flight = page.locator("#overview-in-flight")
    expect(in_flight.locator("tr.state-queued .in-flight-count")).to_have_text("2")
    expect(in_flight.locator("tr.state-running .in-flight-count")).to_have_text("0")
    expect(page.locator("#overview-waiting tr.task-row")).to_have_count(2)
    expect(page.locator("#overview-waiting")).to_contain_text("queue parked")
    expect(page.locator("#no-leader")).to_have_count(0)
    expect(page.locator("#workers-alive")).to_have_text("1")
    expect(page.locator("#overview-latency")).to_contain_text(
        re.compile(r"Recovery: (pool_death|process_death)")
    )
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "overview-admin.png"), full_page=True)

    # A waiting task's id opens its page: the task as the store holds it, then back.
    page.locator("#overview-waiting th.field-task-id a").first.click()
    expect(page.locator("#task-state")).to_have_text("queued")
    expect(page.locator("#task-queue")).to_have_text("parked")
    expect(page.locator("#task-history")).to_contain_text("No event recorded yet")
    page.screenshot(path=str(ARTIFACTS / "task-admin.png"), full_page=True)
    page.go_back()

    page.locator("#dlq-link").click()
    expect(page).to_have_url(f"{live_server.url}/admin/relier_django/deadletter/")
    expect(page.locator("#result_list tbody tr")).to_have_count(2)
    assert dialogs == [] and outside == []
