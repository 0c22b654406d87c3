"""The Prometheus text format of one reading of the figures (``metrics.exposition``).

Kept apart from the reading so that only a process that serves the text imports
``prometheus_client``: the metrics package is imported wherever Django is set up
(the admin's overview page, the URLconf the system checks load), every Celery worker
among them, and an idle worker's memory is shared by its pool processes only for what
it imported before forking them (bench/worker_memory.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from ..core.observe import live
from ..core.observe.measurements import Figures, Histogram

# Counter names, by the store's name for them: (metric, help).
_COUNTERS: dict[str, tuple[str, str]] = {
    "pushed": ("relier_tasks_pushed", "Tasks stored by push() (duplicates, replays not counted)."),
    "committed": ("relier_tasks_committed", "Tasks whose result was committed (once per task)."),
    "retried": ("relier_tasks_retried", "Retries: a failed incarnation turned into the next one."),
    "stale": ("relier_stale_commits_refused", "Commits refused: the incarnation was fenced off."),
    "released": ("relier_tasks_released", "DLQ entries released and taken by the broker."),
    "cancelled": ("relier_tasks_cancelled", "Tasks cancelled (before or while running)."),
    "refused": ("relier_admission_refused", "Pushes refused by admission control."),
}  # fmt: skip


def _histogram(name: str, doc: str, labels: list[str]) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, labels=labels)


def _buckets(h: Histogram) -> list[tuple[str, float]]:
    running, out = 0, []
    for bound, n in zip(h.bounds_s, h.counts, strict=False):
        running += n
        out.append((repr(bound), float(running)))
    out.append(("+Inf", float(h.count)))
    return out


class _Figures(Collector):
    """A collector over one reading: a fresh registry per scrape, so nothing is kept
    between scrapes in the web process."""

    def __init__(self, found: Figures, outbox: dict[str, int | None]) -> None:
        self.found = found
        self.outbox = outbox

    def collect(self) -> Iterator[Any]:
        f = self.found
        for key, (name, doc) in _COUNTERS.items():
            yield CounterMetricFamily(name, doc, value=f.counters.get(key, 0))
        dlq = CounterMetricFamily(
            "relier_tasks_dead_lettered", "Tasks filed in the DLQ, by reason.", labels=["reason"]
        )
        for reason, n in f.dead_lettered.items():
            dlq.add_metric([reason], n)
        yield dlq
        res = CounterMetricFamily(
            "relier_resurrections",
            "Incarnations re-dispatched after their holder was lost, by cause.",
            labels=["cause"],
        )
        for cause, n in f.resurrections.items():
            res.add_metric([cause], n)
        yield res
        deaths = CounterMetricFamily(
            "relier_deaths",
            "Resurrections by how the lost holder died (signal:SIGKILL, exit:3, oom, "
            "connection_closed, ttl_expired, ...).",
            labels=["cause"],
        )
        for cause, n in f.deaths.items():
            deaths.add_metric([cause], n)
        yield deaths
        rec = _histogram(
            "relier_recovery_seconds",
            "Recovery latency: last sign of life of the lost holder -> running again, by cause.",
            ["cause"],
        )
        for cause, h in f.recovery.items():
            rec.add_metric([cause], _buckets(h), h.sum_s)
        yield rec
        for phase, h in f.phases.items():
            doc = {
                "detection": "Recovery phase: last sign of life -> found by a scanner.",
                "redispatch": "Recovery phase: found -> published to the broker.",
                "restart": "Recovery phase: published -> running again.",
            }[phase]
            family = _histogram(f"relier_recovery_{phase}_seconds", doc, [])
            family.add_metric([], _buckets(h), h.sum_s)
            yield family
        wait = _histogram(
            "relier_queue_wait_seconds",
            "From when an incarnation could start (pushed, re-sent, or due) to its start.",
            [],
        )
        wait.add_metric([], _buckets(f.queue_wait), f.queue_wait.sum_s)
        yield wait
        flight = GaugeMetricFamily(
            "relier_tasks_in_flight", "Unfinished tasks by state.", labels=["state"]
        )
        for state, n in f.live.by_state.items():
            flight.add_metric([state], n)
        yield flight
        yield GaugeMetricFamily(
            "relier_oldest_queued_seconds",
            "How long the longest-waiting queued or reserved task has waited (0: none).",
            value=f.live.oldest_queued_s or 0.0,
        )
        yield GaugeMetricFamily(
            "relier_tasks_overdue",
            "Tasks past their deadline, awaiting the scanner (the next resurrections).",
            value=f.live.overdue,
        )
        yield GaugeMetricFamily(
            "relier_recovery_queue_depth",
            "Messages waiting in the broker's recovery queue.",
            value=f.recovery_queue_depth,
        )
        yield GaugeMetricFamily("relier_dlq_entries", "Entries in the DLQ.", value=f.dlq_entries)
        yield GaugeMetricFamily(
            "relier_workers_alive",
            "Worker main processes that announced themselves within one heartbeat TTL.",
            value=len(f.live.workers),
        )
        yield GaugeMetricFamily(
            "relier_scanner_leader",
            "1 while a scanner holds the leader lease, else 0.",
            value=1 if f.leader else 0,
        )
        yield GaugeMetricFamily(
            "relier_slo_objective", "The success ratio the SLO figures measure against.",
            value=f.objective,
        )  # fmt: skip
        ratio = GaugeMetricFamily(
            "relier_slo_success_ratio",
            "Committed / (committed + dead-lettered) over the window (1 when none finished).",
            labels=["window"],
        )
        burn = GaugeMetricFamily(
            "relier_slo_error_budget_burn",
            "Error-budget burn rate over the window: (1 - ratio) / (1 - objective).",
            labels=["window"],
        )
        for window in f.windows:
            ratio.add_metric([window.name], window.ratio)
            burn.add_metric([window.name], window.burn)
        yield ratio
        yield burn
        backlog = GaugeMetricFamily(
            "relier_outbox_backlog",
            "Committed pushes in the transactional outbox, not sent yet, by database.",
            labels=["database"],
        )
        for alias, rows in self.outbox.items():
            if rows is not None:
                backlog.add_metric([alias], rows)
        yield backlog
        yield from self._limits()
        yield GaugeMetricFamily(
            "relier_in_flight_scan_truncated",
            f"1 when more than {live.SCAN_LIMIT} tasks are in flight (the counts cover those).",
            value=1 if f.live.truncated else 0,
        )

    def _limits(self) -> Iterator[Any]:
        """Flow control, one series per task or named limit (a scope's family), never
        per key: a key is a user's value (a tenant, a customer), unbounded in number."""
        f = self.found
        used = GaugeMetricFamily(
            "relier_limit_slots_in_use",
            "Concurrency slots held, per task or named limit (every key summed).",
            labels=["scope"],
        )
        parked = GaugeMetricFamily(
            "relier_limit_parked",
            "Tasks parked waiting for a slot, per task or named limit (every key summed).",
            labels=["scope"],
        )
        now = f.limits.by_family()
        # A family that ever waited keeps its series at 0 once its keys are gone, so a
        # drained limit reads 0, not "no data".
        seen = {family for family, _ in f.throttled} | set(f.limit_wait) | set(now)
        for family in sorted(seen):
            n_used, n_parked = now.get(family, (0, 0))
            used.add_metric([family], n_used)
            parked.add_metric([family], n_parked)
        yield used
        yield parked
        throttled = CounterMetricFamily(
            "relier_tasks_throttled",
            "Tasks that had to wait: for a slot (parked) or for their rate's time.",
            labels=["scope", "by"],
        )
        for (family, by), n in sorted(f.throttled.items()):
            throttled.add_metric([family, by], n)
        yield throttled
        wait = _histogram(
            "relier_limit_wait_seconds",
            "Flow control: from parked to handed a freed slot, per task or named limit.",
            ["scope"],
        )
        for family, h in sorted(f.limit_wait.items()):
            wait.add_metric([family], _buckets(h), h.sum_s)
        yield wait


def text(found: Figures, outbox: dict[str, int | None]) -> bytes:
    """The Prometheus text of ``found`` and of the outbox backlog ``outbox``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Figures(found, outbox))
    return bytes(generate_latest(registry))
