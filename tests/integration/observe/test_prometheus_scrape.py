"""The metrics through real parts: a real Prometheus scrapes the Django project's real
endpoint while real workers run a workload of known truth, and what Prometheus stored
is that truth, exactly; the shipped alert rules are evaluated against it.

The Django test project is served by pytest-django's ``live_server`` (a thread of this
process, so the test's settings apply to it), at ``relier/metrics`` with a bearer
token. One private Prometheus (``testproject/prometheus.py``: a free port of 127.0.0.1,
its own directory, stopped by PID) scrapes it every second with that token and loads
``docs/observability/alerts.yml``. The workload: plain commits, a task that fails twice
and is retried, one that always raises (the DLQ, reason ``exception``), one whose pool
process SIGKILLs itself, and a whole worker SIGKILLed while it runs a task that a
survivor worker takes over (each found by a hand-off, a closed connection or a TTL,
whichever comes first: the test counts the two resurrections, not their causes).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from relier_django.core.model import config
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from relier_django.core.store.receipt import Receipt
from testproject.demo import tasks
from testproject.harness import wait_until
from testproject.prometheus import PrometheusServer, _timestamp

pytestmark = pytest.mark.integration

ALERTS = Path(__file__).resolve().parents[3] / "docs" / "observability" / "alerts.yml"
TOKEN = "scrape-s3cret"
KEYS = KeySpace("rl")
# Quick scans and leader hand-over, as in test_metrics.py: scans every 0.3 s, lease 2 s.
FAST = {"RELIER_SCAN_INTERVAL_S": "0.3", "RELIER_LEADER_LEASE_S": "2"}
# The doomed worker's tasks expire 1.5 s after its last heartbeat. The survivor keeps the
# default TTL (10 s).
DOOMED = {**FAST, "RELIER_HEARTBEAT_TTL_S": "1.5"}
RECORDS = 5


@pytest.fixture(scope="module")
def prometheus(django_db_setup, redis_server, live_server) -> Iterator[PrometheusServer]:
    """One private Prometheus scraping ``live_server`` at ``relier/metrics`` with the
    bearer token, the shipped alert rules loaded.

    It depends on ``redis_server`` so that this process points at the private Redis
    before any scrape can read one; until a test sets ``METRICS_TOKEN`` the endpoint
    answers 403 and the target is simply down.
    """
    port = urlsplit(live_server.url).port
    # 127.0.0.1, not the live server's "localhost": the thread listens on IPv4 only.
    server = PrometheusServer(
        target=f"127.0.0.1:{port}",
        metrics_path="/relier/metrics",
        bearer_token=TOKEN,
        rule_files=[ALERTS],
    ).start()
    try:
        yield server
    finally:
        # Shown by pytest only when a test failed.
        if server.directory is not None and server.log_path.exists():
            print(f"----- prometheus log -----\n{server.log_path.read_text()[-6000:]}")
        server.stop()


def _done(receipts: list[Receipt]) -> bool:
    return all(r.status in ("SUCCESS", "FAILURE") for r in receipts)


def _rules(prometheus: PrometheusServer) -> list[dict[str, Any]]:
    groups = prometheus.api("rules")["groups"]
    return [rule for group in groups for rule in group["rules"]]


def _evaluated_after(prometheus: PrometheusServer, since: float) -> list[dict[str, Any]] | None:
    rules = _rules(prometheus)
    if rules and all(_timestamp(r["lastEvaluation"]) > since for r in rules):
        return rules
    return None


def _run_workload(worker_factory) -> list[Receipt]:  # type: ignore[no-untyped-def]
    """The workload; returns its receipts once each is settled."""
    client = sync_client(config.current())
    doomed = worker_factory(name="doomed", extra_env=DOOMED)
    held = tasks.work.push("p-kill", 3.0)
    wait_until(lambda: client.hget(KEYS.task(held.id), "state") == "running", 30,
               what="the doomed worker runs p-kill")  # fmt: skip
    doomed.kill()  # SIGKILL to the whole worker: no hand-off, its heartbeat stops
    # Pushed after the kill, so that only the survivor ever takes them.
    receipts = [
        held,
        *(tasks.record.push(f"p-{i}") for i in range(RECORDS)),
        tasks.flaky.push("p-flaky", 2),  # fails twice, retried twice, then commits
        tasks.explode.push("p-explode"),  # always raises: the DLQ, reason exception
        tasks.fragile.push("p-fragile", 1),  # its pool process SIGKILLs itself once
    ]
    worker_factory(name="survivor", extra_env=FAST)
    wait_until(lambda: _done(receipts), 60, what="the workload settled")
    return receipts


def test_prometheus_scrapes_the_workload_s_exact_figures_and_evaluates_the_alert_rules(
    prometheus, live_server, worker_factory, redis_client, settings
):
    settings.RELIER = {**settings.RELIER, "METRICS_TOKEN": TOKEN}
    receipts = _run_workload(worker_factory)
    assert [r.status for r in receipts].count("FAILURE") == 1

    settled = time.time()
    target = prometheus.wait_for_scrape(settled, timeout_s=30)
    assert target["scrapeUrl"].endswith(f":{urlsplit(live_server.url).port}/relier/metrics")
    pushed = RECORDS + 4  # the records, flaky, explode, fragile, work
    committed = pushed - 1  # all but explode
    expected = {
        "relier_tasks_pushed_total": pushed,
        "relier_tasks_committed_total": committed,
        "relier_tasks_retried_total": 2,
        'relier_tasks_dead_lettered_total{reason="exception"}': 1,
        # fragile's pool process: its main process's hand-off or its closed connection,
        # whichever comes first; the doomed worker: its connections or its TTL.
        'sum(relier_resurrections_total{cause=~"pool_death|process_death|heartbeat"})': 2,
        'sum(relier_resurrections_total{cause=~"drain|unsent"})': 0,
        'sum(relier_recovery_seconds_count{cause=~"pool_death|process_death|heartbeat"})': 2,
        "sum(relier_recovery_seconds_count)": 2,
        # One per start: the records, 3 runs of flaky, explode, 2 of fragile, 2 of work.
        "relier_queue_wait_seconds_count": RECORDS + 8,
        "relier_dlq_entries": 1,
        "relier_scanner_leader": 1,
        "relier_workers_alive": 1,  # the doomed worker's announcement ran out long ago
        "sum(relier_tasks_in_flight)": 0,
        "relier_tasks_overdue": 0,
        "relier_in_flight_scan_truncated": 0,
        'relier_slo_success_ratio{window="1h"}': committed / pushed,
    }
    found = {expr: prometheus.value(expr) for expr in expected}
    assert found == pytest.approx(expected)
    # One target, so one series: nothing in the rules' `max` aggregation is hidden.
    assert prometheus.value('count(relier_tasks_committed_total{job="relier"})') == 1

    # Rules: every one loaded, each evaluated (healthy) after the scrape above was
    # stored, so the states below are judged on the workload's final figures.
    stored = time.time()
    rules = wait_until(lambda: _evaluated_after(prometheus, stored), 30,
                       what="a rule evaluation after the scrape")  # fmt: skip
    by_name = {rule["name"]: rule for rule in rules}
    assert {
        "RelierDLQGrowing",
        "RelierRecoveryP99AboveSLO",
        "RelierNoScannerLeader",
        "RelierOldestQueuedTooOld",
        "RelierErrorBudgetBurn",
        "RelierErrorBudgetSlowBurn",
    } <= set(by_name)
    unhealthy = {name: rule.get("lastError") for name, rule in by_name.items()
                 if rule["health"] != "ok"}  # fmt: skip
    assert not unhealthy
    # One dead letter in nine finished tasks burns the 99.9 % budget far over 14.4x;
    # its `for: 2m` has not run out, so it is pending (firing only on a slow machine).
    assert by_name["RelierErrorBudgetBurn"]["state"] in ("pending", "firing")
    alerts = prometheus.query('ALERTS{alertname="RelierErrorBudgetBurn"}')
    assert [a["metric"]["severity"] for a in alerts] == ["critical"]
    # The survivor holds the lease, and nothing waits in a queue.
    assert by_name["RelierNoScannerLeader"]["state"] == "inactive"
    assert by_name["RelierOldestQueuedTooOld"]["state"] == "inactive"
