"""The admin's Relier overview: the cluster at a glance (docs/admin-overview.md).

One reading of ``metrics.read`` (what the metrics endpoint and ``relier_status`` show)
and of ``scheduled.periodic``, laid out as the admin's tables, with three charts of the
last hour drawn as inline SVG by ``charts``: no JavaScript, no asset to fetch, no
inline style for a Content-Security-Policy to refuse. The chart functions are pure and
escape every text they write, which is why the view may mark their output safe; task
names and ids never reach an SVG (they are in the HTML lists, autoescaped by the
template).

Read-only: the page asks for the DLQ's view permission, as the schedule pages do
(``pages.read_only``: permission, GET only, never cached, Redis down as a readable 503).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from django.contrib.admin import ModelAdmin
from django.http import HttpRequest, HttpResponse
from django.utils.safestring import mark_safe

from .. import conf, dlq, metrics
from ..core.observe.live import Task
from ..core.observe.measurements import Figures, Histogram, Minute
from ..core.store import workflows
from ..readers import scheduled
from ..readers.render import utc_text
from . import pages
from .charts import hh_mm, svg_bars, svg_lines

TASK_LIMIT = 50  # in-flight tasks listed, running first, oldest first within a state


def charts(minutes: Sequence[Minute]) -> dict[str, str]:
    """The three charts of the last hour: throughput, recovery latency, DLQ inflow."""
    span = (minutes[0].at_s, minutes[-1].at_s) if minutes else None
    latency = [
        ("mean", [(m.at_s, m.recovery_mean_s or 0.0) for m in minutes if m.recoveries]),
        ("max", [(m.at_s, m.recovery_max_s) for m in minutes if m.recoveries]),
    ]
    return {
        "throughput": svg_bars(
            [(m.at_s, m.committed) for m in minutes],
            title="Tasks committed per minute, last hour", unit="tasks/min", x_label=hh_mm,
        ),
        "recovery": svg_lines(
            latency, title="Recovery latency per minute (mean and max), last hour",
            unit="s", x_span=span, gap=60, x_label=hh_mm,
        ),
        "dlq_inflow": svg_bars(
            [(m.at_s, m.dead_lettered) for m in minutes],
            title="Tasks dead-lettered per minute, last hour", unit="tasks/min", x_label=hh_mm,
        ),
    }  # fmt: skip


# --- figures as rows (pure) ---------------------------------------------------------------


def duration(seconds: float | None) -> str:
    """``350 ms``, ``4.2 s``, ``3 min 5 s``, ``2 h 10 min``; ``-`` for None."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    return f"{minutes // 60} h {minutes % 60} min"


def _latency(label: str, h: Histogram) -> dict[str, Any]:
    return {
        "label": label,
        "count": h.count,
        "p50": duration(h.quantile(0.5)),
        "p99": duration(h.quantile(0.99)),
        "mean": duration(h.mean()),
    }


def latency_rows(f: Figures) -> list[dict[str, Any]]:
    """Recovery overall, by cause and by phase, then queue wait: count, p50, p99, mean."""
    rows = [_latency("Recovery, every cause", f.recovery_all)]
    rows += [_latency(f"Recovery: {cause}", h) for cause, h in f.recovery.items()]
    rows += [_latency(f"Phase: {phase}", h) for phase, h in f.phases.items()]
    rows.append(_latency("Queue wait", f.queue_wait))
    return rows


_COUNTED = (
    ("Pushed", "pushed"), ("Committed", "committed"), ("Retried", "retried"),
    ("Released from the DLQ", "released"), ("Cancelled", "cancelled"),
    ("Stale commits refused", "stale"), ("Admission refused", "refused"),
)  # fmt: skip


def totals(f: Figures) -> list[tuple[str, int]]:
    """Every count since the store's first task, as (label, count)."""
    counted = [(label, f.counters.get(name, 0)) for label, name in _COUNTED]
    dead, resurrected = sum(f.dead_lettered.values()), sum(f.resurrections.values())
    return [*counted[:3], ("Dead-lettered", dead), ("Resurrected", resurrected), *counted[3:]]


def slo_rows(f: Figures) -> list[dict[str, Any]]:
    return [
        {
            "name": w.name,
            "committed": w.committed,
            "dead_lettered": w.dead_lettered,
            "ratio": f"{w.ratio:.4%}",
            "burn": f"{w.burn:.2f}x",
            "over": w.burn > 1,
        }
        for w in f.windows
    ]


def task_rows(
    tasks: Sequence[Task], url: Callable[[str], str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The listed in-flight tasks, split: running, and the rest (queued, reserved,
    recovering); each with ``url(task_id)``, its task page."""
    rows: list[dict[str, Any]] = [
        {"task": t, "age": duration(t.age_s), "url": url(t.task_id)} for t in tasks
    ]
    running = [r for r in rows if r["task"].state == "running"]
    return running, [r for r in rows if r["task"].state != "running"]


# --- the view -----------------------------------------------------------------------------


WORKFLOW_LIMIT = 10


def workflow_rows(model_admin: ModelAdmin) -> list[dict[str, Any]]:
    """The newest workflows (chains, groups, chords), each with its state and counts;
    a task of one that is in the DLQ links to its entry."""
    cfg = conf.get_config()
    rows = []
    for workflow_id in workflows.recent(cfg, WORKFLOW_LIMIT):
        view = workflows.read(cfg, workflow_id)
        if view is None:  # its record expired; the index forgets it later
            continue
        failed = [(s.task_id, pages.url(model_admin, "detail", s.task_id)) for s in view.failed]
        rows.append(
            {
                "view": view,
                "created": utc_text(view.created_ms),
                "total": len(view.steps),
                "failed": failed,
            }
        )
    return rows


def _periodic_rows(model_admin: ModelAdmin, view: scheduled.Periodic) -> list[dict[str, Any]]:
    """Each periodic entry; a last tick that failed links to its DLQ entry while the
    DLQ holds it (a tick's task id is its entry id)."""
    store = dlq.store()
    rows = []
    for e in view.entries:
        failed = e.last_outcome == "FAILURE" and e.last_task_id is not None
        in_dlq = failed and store.get(e.last_task_id or "") is not None
        dlq_url = pages.url(model_admin, "detail", e.last_task_id or "") if in_dlq else None
        rows.append(
            {
                "entry": e,
                "last": None if e.last_tick_ms is None else utc_text(e.last_tick_ms),
                "dlq_url": dlq_url,
                "next": utc_text(e.next_tick_ms),
                "next_in": duration(max(0, e.next_tick_ms - view.now_ms) / 1000),
            }
        )
    return rows


def _figures(f: Figures, task_url: Callable[[str], str]) -> dict[str, Any]:
    running, waiting = task_rows(f.live.tasks, task_url)
    return {
        "at": utc_text(f.at_ms),
        "f": f,
        "workers": f.live.workers,
        "in_flight": list(f.live.by_state.items()),
        "oldest_queued": duration(f.live.oldest_queued_s),
        # Flow control: slots held and tasks parked, every scope summed (its own page).
        "limits_in_use": (
            sum(s.in_use for s in f.limits.scopes),
            sum(s.parked_total for s in f.limits.scopes),
        ),
        "totals": totals(f),
        "latency": latency_rows(f),
        "slo": slo_rows(f),
        "objective": f"{f.objective:.3%}",
        # svg_* escape every text they write and format every number: safe to embed.
        "charts": {name: mark_safe(svg) for name, svg in charts(f.minutes).items()},
        "task_lists": [
            ("overview-running", "Running", running),
            ("overview-waiting", "Queued, reserved and recovering", waiting),
        ],
        "task_limit": TASK_LIMIT,
    }


@pages.read_only("the cluster's figures cannot be shown")
def overview(request: HttpRequest, model_admin: ModelAdmin) -> HttpResponse:
    """The overview page; 503 with what to check when relier's Redis cannot be read."""
    found = metrics.read(task_limit=TASK_LIMIT)
    periodic = scheduled.periodic()
    extra = {
        **_figures(found, functools.partial(pages.url, model_admin, "task")),
        "periodic": _periodic_rows(model_admin, periodic),
        "outbox": sorted(metrics.outbox_backlog().items()),
        "workflows": workflow_rows(model_admin),
        "workflow_limit": WORKFLOW_LIMIT,
        "not_fired": periodic.not_fired,
    }
    values = pages.context(request, model_admin, "Relier overview", **extra)
    return pages.render(request, "overview.html", values)
