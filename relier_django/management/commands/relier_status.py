"""``manage.py relier_status``: the cluster at a glance, read from relier's Redis.

Workers alive and the tasks they hold, in-flight tasks by state (with age and fence),
the recovery figures, the scheduled and periodic work, the DLQ, flow control's limits
in use, the scanner leader and the SLO windows. ``--watch`` redraws it every few
seconds, like ``top``; ``--json`` prints the same figures as one JSON object (the
figures the metrics endpoint serves; docs/observability.md).
"""

from __future__ import annotations

import json
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from redis.exceptions import RedisError

from relier_django import conf, metrics
from relier_django.core.observe.measurements import Figures, Histogram
from relier_django.readers import scheduled
from relier_django.readers.render import utc_text

_CLEAR = "\x1b[H\x1b[2J"


def _s(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"


def _quantiles(h: Histogram) -> str:
    if not h.count:
        return "none yet"
    return f"{h.count} · p50 {_s(h.quantile(0.5))} · p99 {_s(h.quantile(0.99))}"


def render(f: Figures, periodic: list[str]) -> list[str]:
    """The text form, one line per item (a test reads it)."""
    c, by = f.counters, f.live.by_state
    lines = [
        f"relier status at {utc_text(f.at_ms)} (Redis clock)",
        "",
        f"workers alive: {len(f.live.workers)}   scanner leader: {f.leader or 'NONE'}",
    ]
    lines += [f"  {w.id}  holds {w.tasks}" for w in f.live.workers]
    oldest = f.live.oldest_queued_s
    lines += [
        "",
        "in flight: " + "  ".join(f"{state} {n}" for state, n in by.items())
        + f"   oldest queued {_s(oldest)}   overdue {f.live.overdue}"
        + ("   (scan truncated)" if f.live.truncated else ""),
    ]  # fmt: skip
    if f.live.tasks:
        rows = [("STATE", "AGE", "FENCE", "TASK", "ID", "WORKER")]
        rows += [
            (t.state, _s(t.age_s), str(t.fence), t.name, t.task_id, t.worker or "-")
            for t in f.live.tasks
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
                  for r in rows]  # fmt: skip
    res = ", ".join(f"{cause} {n}" for cause, n in f.resurrections.items())
    lines += [
        "",
        f"totals: pushed {c['pushed']}  committed {c['committed']}  retried {c['retried']}  "
        f"dead-lettered {sum(f.dead_lettered.values())}  released {c['released']}  "
        f"cancelled {c['cancelled']}  stale commits refused {c['stale']}  "
        f"admission refused {c['refused']}",
        f"resurrections: {res}",
        f"recovery (last sign of life -> running again): {_quantiles(f.recovery_all)}",
    ]
    lines += [f"  {cause}: {_quantiles(h)}" for cause, h in f.recovery.items() if h.count]
    lines += [f"  {phase}: {_quantiles(h)}" for phase, h in f.phases.items() if h.count]
    lines += [
        f"queue wait: {_quantiles(f.queue_wait)}",
        f"recovery queue: {f.recovery_queue_depth} message(s)",
        "",
        f"DLQ: {f.dlq_entries} entr{'y' if f.dlq_entries == 1 else 'ies'}"
        + (
            " (" + ", ".join(f"{r} {n}" for r, n in f.dead_lettered.items()) + " filed in all)"
            if f.dead_lettered
            else ""
        ),
        f"scheduled: {by.get('scheduled', 0)} task(s)",
    ]
    lines += periodic
    lines += _limits(f)
    lines += ["", f"SLO (objective {f.objective:.3%}):"]
    lines += [
        f"  {w.name}: success {w.ratio:.4%} ({w.committed} committed, {w.dead_lettered} "
        f"dead-lettered), budget burn {w.burn:.2f}x"
        for w in f.windows
    ]
    return lines


SCOPES_LISTED = 20  # the busiest scopes (most parked, then most slots held)


def _limits(f: Figures) -> list[str]:
    """Flow control: the scopes in use, the busiest first, what had to wait and how
    long a parked task waited for its slot, per task or named limit."""
    scopes = f.limits.scopes
    used = sum(s.in_use for s in scopes)
    parked = sum(s.parked_total for s in scopes)
    lines = [
        "",
        f"limits: {len(scopes)} scope(s) in use, {used} slot(s) held, {parked} parked",
    ]
    busiest = sorted(scopes, key=lambda s: (-s.parked_total, -s.in_use, s.scope))
    for s in busiest[:SCOPES_LISTED]:
        line = f"  {s.scope}: {s.in_use}" + (f"/{s.capacity}" if s.capacity else "") + " held"
        if s.parked:
            line += f", {s.parked_total} parked under {len(s.parked)} key(s), "
            line += f"oldest waiting {_s(s.oldest_wait_s)}"
        if s.rate_next_free_ms is not None:
            line += f", rate free in {_s(max(0, s.rate_next_free_ms - f.limits.at_ms) / 1000)}"
        elif s.rate_reserved_until_ms is not None:
            line += f", rate reserved up to {utc_text(s.rate_reserved_until_ms)}"
        lines.append(line)
    if len(busiest) > SCOPES_LISTED:
        lines.append(f"  ... and {len(busiest) - SCOPES_LISTED} more")
    families = sorted({family for family, _ in f.throttled} | set(f.limit_wait))
    for family in families:
        slot, rate = f.throttled.get((family, "slot"), 0), f.throttled.get((family, "rate"), 0)
        wait = f.limit_wait.get(family, Histogram())
        lines.append(
            f"  {family}: waited for a slot {slot}, for the rate {rate}; "
            f"parked -> granted {_quantiles(wait)}"
        )
    return lines


def _periodic() -> list[str]:
    try:
        found = scheduled.periodic()
    except Exception as exc:  # the live view still shows everything else
        return [f"periodic: cannot list ({type(exc).__name__}: {exc})"]
    lines = [f"periodic: {len(found.entries)} entr{'y' if len(found.entries) == 1 else 'ies'}"]
    lines += [
        f"  {e.name} ({e.schedule}): last {e.last_outcome or '-'}, next {utc_text(e.next_tick_ms)}"
        for e in found.entries
    ]
    lines += [f"  {n.name}: NOT FIRED ({n.problem})" for n in found.not_fired]
    return lines


class Command(BaseCommand):
    help = (
        "Show the cluster: workers, in-flight tasks by state, recovery latency, the "
        "recovery queue, scheduled and periodic work, the DLQ, the limits in use, the "
        "scanner leader and the "
        "SLO windows. --watch refreshes it; --json prints one JSON object."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--json", action="store_true", dest="as_json", help="one JSON object")
        parser.add_argument(
            "--watch", action="store_true", help="redraw every --interval seconds (Ctrl-C stops)"
        )
        parser.add_argument("--interval", type=float, default=2.0, help="seconds (--watch)")
        parser.add_argument("--tasks", type=int, default=20, help="in-flight tasks listed")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["interval"] <= 0 or options["tasks"] < 0:
            raise CommandError("--interval must be > 0 and --tasks >= 0")
        while True:
            try:
                found = metrics.read(task_limit=options["tasks"])
            except RedisError as exc:
                raise CommandError(
                    f"relier's Redis cannot be read at {conf.redis_location()}: {exc}"
                ) from exc
            if options["as_json"]:
                self.stdout.write(json.dumps(found.to_json(), sort_keys=True))
            else:
                text = "\n".join(render(found, _periodic()))
                self.stdout.write((_CLEAR if options["watch"] else "") + text)
            if not options["watch"]:
                return
            try:
                time.sleep(options["interval"])
            except KeyboardInterrupt:
                return
