"""The shipped alert rules and Grafana dashboard are valid, name only metrics the endpoint
serves, and the alerts fire when they should and only then.

promtool (Debian's prometheus package, installed by scripts/bootstrap.sh) checks and
unit-tests the rules without a server. A missing promtool fails these tests: it never
skips them.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
ALERTS = REPO_ROOT / "docs" / "observability" / "alerts.yml"
DASHBOARD = REPO_ROOT / "docs" / "observability" / "grafana-dashboard.json"
ALERTS_TEST = Path(__file__).resolve().parent / "alerts_test.yml"

# The endpoint's contract (relier/metrics): what a rule or a panel may query.
COUNTERS = frozenset(
    {
        "relier_tasks_pushed_total",
        "relier_tasks_committed_total",
        "relier_tasks_retried_total",
        "relier_tasks_dead_lettered_total",
        "relier_resurrections_total",
        "relier_deaths_total",
        "relier_stale_commits_refused_total",
        "relier_tasks_released_total",
        "relier_tasks_cancelled_total",
        "relier_admission_refused_total",
    }
)
HISTOGRAMS = frozenset(
    {
        "relier_recovery_seconds",
        "relier_recovery_detection_seconds",
        "relier_recovery_redispatch_seconds",
        "relier_recovery_restart_seconds",
        "relier_queue_wait_seconds",
    }
)
GAUGES = frozenset(
    {
        "relier_tasks_in_flight",
        "relier_oldest_queued_seconds",
        "relier_recovery_queue_depth",
        "relier_dlq_entries",
        "relier_workers_alive",
        "relier_scanner_leader",
        "relier_slo_success_ratio",
        "relier_slo_error_budget_burn",
        "relier_slo_objective",
        "relier_tasks_overdue",
        "relier_in_flight_scan_truncated",
        "relier_outbox_backlog",
    }
)
# A histogram is exposed as its three series only: a bare histogram name selects nothing.
SERIES = (
    COUNTERS
    | GAUGES
    | {f"{name}{suffix}" for name in HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}
)

# A relier_* identifier; in PromQL that can only be a metric name (label names and
# functions never start so).
METRIC_NAME = re.compile(r"\brelier_[a-zA-Z0-9_]*")


def promtool(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool is not on PATH: run ./scripts/bootstrap.sh (Debian's prometheus)")
    return subprocess.run(
        [binary, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def family(series: str) -> str:
    """The metric a series belongs to: a histogram's name for its _bucket/_sum/_count."""
    base, _, suffix = series.rpartition("_")
    return base if suffix in ("bucket", "sum", "count") and base in HISTOGRAMS else series


def rule_expressions(text: str) -> list[str]:
    """Each rule's ``expr`` in a rules file, inline or a block scalar (``|``, ``>``).

    A deliberately small reader of the one YAML shape the file uses (the tests run
    without a YAML library); ``test_every_rule_has_one_expression_read`` proves it
    misses none.
    """
    lines = text.splitlines()
    exprs: list[str] = []
    for i, line in enumerate(lines):
        match = re.match(r"^(\s*)expr:\s*(.*)$", line)
        if match is None:
            continue
        indent, value = len(match[1]), match[2].strip()
        if value[:1] not in ("|", ">"):
            exprs.append(value.strip("'\""))
            continue
        block = []
        for following in lines[i + 1 :]:
            if following.strip() and len(following) - len(following.lstrip()) <= indent:
                break
            block.append(following.strip())
        exprs.append(" ".join(filter(None, block)))
    return exprs


def dashboard_expressions(node: Any) -> Iterator[str]:
    """Every ``expr`` anywhere in the dashboard: panels, rows' panels, templating."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from dashboard_expressions(value)
    elif isinstance(node, list):
        for item in node:
            yield from dashboard_expressions(item)


def test_promtool_accepts_the_alert_rules():
    result = promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_rule_has_one_expression_read():
    text = ALERTS.read_text()
    rules = re.findall(r"^\s*- (?:alert|record):", text, flags=re.MULTILINE)
    exprs = rule_expressions(text)
    assert len(exprs) == len(rules) >= 5
    assert all(METRIC_NAME.search(expr) for expr in exprs), exprs


def test_the_alert_rules_query_only_metrics_the_endpoint_serves():
    names = {
        name for expr in rule_expressions(ALERTS.read_text()) for name in METRIC_NAME.findall(expr)
    }
    assert names, "no relier_* metric found in the rules"
    assert names <= SERIES, f"not served by relier/metrics: {sorted(names - SERIES)}"


def test_the_expected_alerts_exist_each_with_a_severity_a_summary_and_a_description():
    text = ALERTS.read_text()
    blocks = re.split(r"^\s*- alert:\s*", text, flags=re.MULTILINE)[1:]
    alerts = {block.split()[0]: block for block in blocks}
    assert {
        "RelierDLQGrowing",
        "RelierRecoveryP99AboveSLO",
        "RelierNoScannerLeader",
        "RelierOldestQueuedTooOld",
        "RelierErrorBudgetBurn",
    } <= set(alerts)
    for name, block in alerts.items():
        assert re.search(r"^\s*severity: (critical|warning|info)$", block, re.MULTILINE), name
        assert re.search(r"^\s*summary:", block, re.MULTILINE), name
        assert re.search(r"^\s*description:", block, re.MULTILINE), name


def test_the_dashboard_queries_only_metrics_the_endpoint_serves():
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = list(dashboard_expressions(dashboard))
    assert len(exprs) >= 11
    names = {name for expr in exprs for name in METRIC_NAME.findall(expr)}
    assert names <= SERIES, f"not served by relier/metrics: {sorted(names - SERIES)}"
    # Every family the endpoint serves has a place on the dashboard.
    missing = (COUNTERS | GAUGES | HISTOGRAMS) - {family(name) for name in names}
    assert not missing, f"served but on no panel: {sorted(missing)}"


def test_the_dashboards_expressions_are_valid_promql(tmp_path):
    # promtool has no expression checker, so each expression becomes a recording rule;
    # Grafana's $__rate_interval becomes a duration PromQL knows.
    exprs = list(dashboard_expressions(json.loads(DASHBOARD.read_text())))
    rules = [
        {"record": f"relier:dashboard_{i}", "expr": expr.replace("$__rate_interval", "1m")}
        for i, expr in enumerate(exprs)
    ]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_panel_uses_the_datasource_variable():
    dashboard = json.loads(DASHBOARD.read_text())
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert [v["name"] for v in dashboard["templating"]["list"] if v["type"] == "datasource"] == [
        "DS_PROMETHEUS"
    ]
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], panel["title"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_the_alerts_fire_on_the_series_that_should_fire_them_and_only_on_those():
    # alerts_test.yml: RelierNoScannerLeader, RelierOldestQueuedTooOld and the others,
    # each against series that must fire it and series that must not.
    result = promtool("test", "rules", ALERTS_TEST.name, cwd=ALERTS_TEST.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
