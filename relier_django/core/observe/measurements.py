"""The whole cluster's figures, read from the store: what the metrics endpoint, the
``relier_status`` command and the admin overview show.

Counters and histograms are kept by the Lua scripts that do each act
(``store/lua/_metrics.lua``), so any one process reads the same numbers for the whole
cluster, and counting costs the task path no round trip. Gauges (tasks in flight by
state, the oldest queued task, live workers, the DLQ's size, the scanner leader) are
read from the store's own indexes when asked (``live.py``): they cannot drift from
what the store holds, because they are what it holds.

A partitioned store keeps these hashes and indexes per partition (``KeySpace.parts``):
a reading sums every partition's, in the same round trip.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from ..model.config import Config
from ..model.rates import Rate
from ..store.connection import execute_timed, timed_pipeline
from ..store.keys import KeySpace
from . import limits as flow
from . import live

# Histogram bucket upper bounds, ms; _metrics.lua's METRIC_BOUNDS_MS (a unit test keeps
# the two equal). Past the last one is +Inf.
BOUNDS_MS: tuple[int, ...] = (
    10, 25, 50, 100, 250, 500, 1000, 2000, 5000, 10000, 12500,
    15000, 20000, 30000, 60000, 120000, 300000,
)  # fmt: skip
MINUTE_SLOTS, HOUR_SLOTS = 120, 80  # _metrics.lua's rings

# Resurrection causes (resurrect.lua): a dead holder's heartbeat ran out; a pool process
# died and its parent handed the task off; a stopping worker handed it off; the message
# never reached a worker within the queued grace; the holder's liveness connection
# closed (its process died: recovery/deaths.py).
CAUSES: tuple[str, ...] = ("heartbeat", "pool_death", "drain", "unsent", "process_death")
# The counters of _metrics.lua, by their name in the store.
COUNTERS: tuple[str, ...] = (
    "pushed", "committed", "retried", "stale", "released", "cancelled", "refused",
)  # fmt: skip
PHASES: tuple[str, ...] = ("detection", "redispatch", "restart")
SLO_WINDOWS: tuple[tuple[str, int], ...] = (("1h", 60), ("6h", 6 * 60), ("3d", 72 * 60))


@dataclass(frozen=True, slots=True)
class Histogram:
    """Observations by bucket (not cumulative; the last bucket is +Inf), in seconds."""

    counts: tuple[int, ...] = (0,) * (len(BOUNDS_MS) + 1)
    sum_s: float = 0.0

    @property
    def count(self) -> int:
        return sum(self.counts)

    @property
    def bounds_s(self) -> tuple[float, ...]:
        return tuple(b / 1000 for b in BOUNDS_MS)

    def quantile(self, q: float) -> float | None:
        """The q-quantile, interpolated inside its bucket as Prometheus's
        ``histogram_quantile`` does; None without observations. In the +Inf bucket it
        is the last finite bound (a floor, as in Prometheus)."""
        total = self.count
        if not total:
            return None
        rank, seen, lower = q * total, 0, 0.0
        for bound, n in zip(self.bounds_s, self.counts, strict=False):
            if n and seen + n >= rank:
                return lower + (bound - lower) * (rank - seen) / n
            seen, lower = seen + n, bound
        return lower

    def mean(self) -> float | None:
        return self.sum_s / self.count if self.count else None


@dataclass(frozen=True, slots=True)
class SloWindow:
    """Outcomes over one window: committed (success) against dead-lettered (failure)."""

    name: str
    committed: int
    dead_lettered: int
    objective: float

    @property
    def ratio(self) -> float:
        """Success ratio; 1.0 when nothing finished (no failure, no budget spent)."""
        total = self.committed + self.dead_lettered
        return self.committed / total if total else 1.0

    @property
    def burn(self) -> float:
        """Error-budget burn rate: 1.0 spends the budget exactly over the window."""
        return (1.0 - self.ratio) / (1.0 - self.objective)


@dataclass(frozen=True, slots=True)
class Minute:
    """One minute of the last hour (start, epoch seconds)."""

    at_s: int
    committed: int = 0
    dead_lettered: int = 0
    recoveries: int = 0
    recovery_sum_s: float = 0.0
    recovery_max_s: float = 0.0

    @property
    def recovery_mean_s(self) -> float | None:
        return self.recovery_sum_s / self.recoveries if self.recoveries else None


@dataclass(frozen=True, slots=True)
class Figures:
    """One reading of the cluster. ``at_ms`` is the Redis clock's."""

    at_ms: int
    counters: Mapping[str, int]
    dead_lettered: Mapping[str, int]  # by reason, since the store's first task
    resurrections: Mapping[str, int]  # by cause
    recovery: Mapping[str, Histogram]  # by cause: last sign of life -> running again
    phases: Mapping[str, Histogram]  # detection, redispatch, restart
    queue_wait: Histogram
    live: live.Live
    dlq_entries: int
    leader: str | None
    recovery_queue_depth: int
    windows: tuple[SloWindow, ...]
    minutes: tuple[Minute, ...]  # the last 60, oldest first
    objective: float
    extra: Mapping[str, Any] = field(default_factory=dict)
    # Flow control (docs/flow-control.md): the scopes in use, tasks that had to wait
    # by (family, 'slot' | 'rate'), and the parked -> granted wait by family.
    limits: flow.Limits = field(default_factory=lambda: flow.Limits(0, ()))
    throttled: Mapping[tuple[str, str], int] = field(default_factory=dict)
    limit_wait: Mapping[str, Histogram] = field(default_factory=dict)
    # Resurrections by how the holder died (signal:SIGKILL, exit:3, oom,
    # connection_closed, ttl_expired, ...): only the causes seen so far.
    deaths: Mapping[str, int] = field(default_factory=dict)

    @property
    def recovery_all(self) -> Histogram:
        """Every cause together."""
        return _merged(self.recovery.values())

    def to_json(self) -> dict[str, Any]:
        """Plain data (``relier_status --json``)."""

        def hist(h: Histogram) -> dict[str, Any]:
            return {
                "count": h.count, "sum_s": round(h.sum_s, 3),
                "p50_s": _round(h.quantile(0.5)), "p99_s": _round(h.quantile(0.99)),
                "buckets": {
                    **{str(b): n for b, n in zip(h.bounds_s, h.counts, strict=False)},
                    "+Inf": h.counts[-1],
                },
            }  # fmt: skip

        return {
            "at_ms": self.at_ms,
            "counters": dict(self.counters),
            "dead_lettered": dict(self.dead_lettered),
            "resurrections": dict(self.resurrections),
            "deaths": dict(self.deaths),
            "recovery": {cause: hist(h) for cause, h in self.recovery.items()},
            "recovery_phases": {name: hist(h) for name, h in self.phases.items()},
            "queue_wait": hist(self.queue_wait),
            "in_flight": dict(self.live.by_state),
            "oldest_queued_s": _round(self.live.oldest_queued_s),
            "overdue": self.live.overdue,
            "workers": [{"id": w.id, "tasks": w.tasks} for w in self.live.workers],
            "scanner_leader": self.leader,
            "recovery_queue_depth": self.recovery_queue_depth,
            "dlq_entries": self.dlq_entries,
            "slo": {
                "objective": self.objective,
                "windows": {
                    w.name: {
                        "committed": w.committed,
                        "dead_lettered": w.dead_lettered,
                        "success_ratio": w.ratio,
                        "error_budget_burn": round(w.burn, 4),
                    }
                    for w in self.windows
                },
            },
            "last_hour": [
                {
                    "at_s": m.at_s,
                    "committed": m.committed,
                    "dead_lettered": m.dead_lettered,
                    "recoveries": m.recoveries,
                    "recovery_mean_s": _round(m.recovery_mean_s),
                    "recovery_max_s": m.recovery_max_s,
                }
                for m in self.minutes
            ],
            "tasks": [t.to_json() for t in self.live.tasks],
            "scan_truncated": self.live.truncated,
            "limits": {
                **self.limits.to_json(),
                "throttled": [
                    {"family": family, "by": by, "count": n}
                    for (family, by), n in sorted(self.throttled.items())
                ],
                "wait": {family: hist(h) for family, h in sorted(self.limit_wait.items())},
            },
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _merged(histograms: Any) -> Histogram:
    counts = [0] * (len(BOUNDS_MS) + 1)
    total = 0.0
    for h in histograms:
        counts = [a + b for a, b in zip(counts, h.counts, strict=True)]
        total += h.sum_s
    return Histogram(tuple(counts), total)


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _summed(hashes: Iterable[Mapping[Any, Any]]) -> dict[str, int]:
    """Every partition's counters hash as one, field by field: a partition's scripts
    count the acts done in it only, so each sum (a counter, a histogram's bucket or
    sum) is the whole store's."""
    total: Counter[str] = Counter()
    for raw in hashes:
        total.update({_text(k): int(v) for k, v in raw.items()})
    return dict(total)


def _merged_windows(hashes: Iterable[Mapping[Any, Any]]) -> dict[str, int]:
    """Every partition's windows hash as one, in the same layout. A ring slot's stamp
    is the newest index any partition stamped it with, and its fields sum (``rec_max``:
    the greatest) over the partitions whose stamp is that one. Another partition's
    older index in the same slot is a whole ring back: outside every window read
    (``_slo``, ``_minutes``), which spans fewer indexes than a ring has slots."""
    each = [{_text(k): int(v) for k, v in raw.items()} for raw in hashes]
    merged: dict[str, int] = {}
    for windows in each:
        for name, value in windows.items():
            if ":" not in name:  # a slot's stamp: 'm17', 'h3'
                merged[name] = max(merged.get(name, value), value)
    for windows in each:
        for name, value in windows.items():
            slot, sep, what = name.partition(":")
            if not sep or windows.get(slot) != merged.get(slot):
                continue
            if what == "rec_max":
                merged[name] = max(merged.get(name, value), value)
            else:
                merged[name] = merged.get(name, 0) + value
    return merged


def _histograms(raw: Mapping[str, int]) -> dict[str, Histogram]:
    """'h:<name>:<bucket>' and 'h:<name>:sum' fields -> histograms by name."""
    counts: dict[str, list[int]] = {}
    sums: dict[str, int] = {}
    for field_name, value in raw.items():
        if not field_name.startswith("h:"):
            continue
        name, _, part = field_name[2:].rpartition(":")
        if part == "sum":
            sums[name] = value
        elif part.isdigit() and 1 <= int(part) <= len(BOUNDS_MS) + 1:
            counts.setdefault(name, [0] * (len(BOUNDS_MS) + 1))[int(part) - 1] = value
    return {
        name: Histogram(
            tuple(counts.get(name, [0] * (len(BOUNDS_MS) + 1))), sums.get(name, 0) / 1000
        )
        for name in counts.keys() | sums.keys()
    }


def _slots(raw: Mapping[str, int], ring: str, index: int, back: int, slots: int) -> list[int]:
    """The slot names of ring ``ring`` holding indexes (index - back, index], each only
    if its stamp says it holds that index (a slot not reused since is older)."""
    held = []
    for i in range(index - back + 1, index + 1):
        slot = f"{ring}{i % slots}"
        if raw.get(slot) == i:
            held.append(i)
    return held


def read(
    client: redis.Redis,
    config: Config,
    *,
    broker_depth: Callable[[], int] | None = None,
    task_limit: int = live.TASK_LIST_LIMIT,
    limit_rates: Mapping[str, Rate] | None = None,
) -> Figures:
    """Read every figure: a few round trips, plus the in-flight scan (``live.scan``)
    and the flow-control reading (``limits.read``, given the tasks' own rates).

    ``broker_depth`` counts the recovery queue's messages on the broker (the Django
    layer passes one built from the Celery app); without it the depth reads 0."""
    keys = KeySpace.of(config)
    parts = keys.parts()
    pipe = timed_pipeline(client)
    pipe.get(keys.leader)
    for p in parts:
        pipe.hgetall(p.metrics_counters)
        pipe.hgetall(p.metrics_windows)
        pipe.zcard(p.dlq)
    now_ms, (leader, *each) = execute_timed(client, pipe)
    counters = _summed(each[0::3])
    windows = _merged_windows(each[1::3])
    dlq_entries = sum(int(n) for n in each[2::3])
    histograms = _histograms(counters)
    objective = config.slo_objective
    return Figures(
        at_ms=now_ms,
        counters={name: counters.get(name, 0) for name in COUNTERS},
        dead_lettered=_labelled(counters, "dlq:"),
        resurrections={**dict.fromkeys(CAUSES, 0), **_labelled(counters, "res:")},
        recovery={
            cause: histograms.get(f"recovery:{cause}", Histogram())
            for cause in sorted({*CAUSES, *_suffixes(histograms, "recovery:")})
        },
        phases={name: histograms.get(name, Histogram()) for name in PHASES},
        queue_wait=histograms.get("queue_wait", Histogram()),
        live=live.scan(client, keys, now_ms, task_limit=task_limit),
        dlq_entries=dlq_entries,
        leader=_text(leader) if leader is not None else None,
        recovery_queue_depth=broker_depth() if broker_depth is not None else 0,
        windows=_slo(windows, now_ms, objective),
        minutes=_minutes(windows, now_ms),
        objective=objective,
        limits=flow.read(client, config, limit_rates),
        throttled=_throttled(counters),
        deaths=_labelled(counters, "death:"),
        limit_wait={
            name.removeprefix("lim_wait:"): h
            for name, h in histograms.items()
            if name.startswith("lim_wait:")
        },
    )


def _throttled(counters: Mapping[str, int]) -> dict[tuple[str, str], int]:
    # 'thr:slot:<family>', 'thr:rate:<family>' (_limits.lua)
    found = {}
    for name, n in counters.items():
        kind, sep, by_family = name.partition(":")
        by, sep2, family = by_family.partition(":")
        if kind == "thr" and sep and sep2 and by in ("slot", "rate"):
            found[(family, by)] = n
    return found


def _labelled(counters: Mapping[str, int], prefix: str) -> dict[str, int]:
    return {k.removeprefix(prefix): v for k, v in sorted(counters.items()) if k.startswith(prefix)}


def _suffixes(histograms: Mapping[str, Histogram], prefix: str) -> set[str]:
    return {name.removeprefix(prefix) for name in histograms if name.startswith(prefix)}


def _slo(windows: Mapping[str, int], now_ms: int, objective: float) -> tuple[SloWindow, ...]:
    minute = now_ms // 60_000
    hour = minute // 60
    found = []
    for name, minutes in SLO_WINDOWS:
        if minutes <= MINUTE_SLOTS:
            ring, index, back, slots = "m", minute, minutes, MINUTE_SLOTS
        else:  # whole hours: the current one and those before it
            ring, index, back, slots = "h", hour, math.ceil(minutes / 60), HOUR_SLOTS
        held = _slots(windows, ring, index, back, slots)
        ok = sum(windows.get(f"{ring}{i % slots}:ok", 0) for i in held)
        bad = sum(windows.get(f"{ring}{i % slots}:dlq", 0) for i in held)
        found.append(SloWindow(name, ok, bad, objective))
    return tuple(found)


def _minutes(windows: Mapping[str, int], now_ms: int) -> tuple[Minute, ...]:
    minute = now_ms // 60_000
    held = set(_slots(windows, "m", minute, 60, MINUTE_SLOTS))
    found = []
    for i in range(minute - 59, minute + 1):
        slot = f"m{i % MINUTE_SLOTS}"
        if i not in held:
            found.append(Minute(i * 60))
            continue
        found.append(
            Minute(
                i * 60,
                committed=windows.get(f"{slot}:ok", 0),
                dead_lettered=windows.get(f"{slot}:dlq", 0),
                recoveries=windows.get(f"{slot}:rec_n", 0),
                recovery_sum_s=windows.get(f"{slot}:rec_ms", 0) / 1000,
                recovery_max_s=windows.get(f"{slot}:rec_max", 0) / 1000,
            )
        )
    return tuple(found)
