"""Durable scheduling: how late a scheduled task starts, what it costs Redis to hold,
and how often a delayed task runs twice, relier_django against vanilla Celery's ETA.

One private Redis. First, with no worker running, ``--tasks`` relier tasks are pushed
with a one-hour countdown and ``INFO memory``'s ``used_memory`` is read before and
after: the memory one scheduled task holds (task hash, schedule index entry), divided
out; then the data is flushed. Then one relier_django worker (2 prefork processes, its
embedded scanner leading) and one vanilla Celery worker (2 processes, kombu's own Redis
transport, queue ``bench.plain``, no scanner) start, and three groups are pushed:

- **spread**: ``--tasks`` relier tasks (``demo.sched_probe``) with countdowns uniform
  over 1 s to ``--spread`` s;
- **long**: ``--celery-tasks`` relier tasks with countdowns of 40-60 s, beyond the
  broker's visibility timeout (30 s);
- **celery**: as many vanilla Celery tasks (``demo.plain_sched``) pushed with
  ``apply_async(countdown=40-60 s)``.

Every run of a task records its due time and its start, both on the Redis clock
(``TIME``): relier's due time is the one ``push.lua`` set (``ctx.scheduled_at``),
Celery's the message's ETA (this process's clock; the same machine). Lateness is start
minus due. Runs are counted per task: a second record is a second run. kombu's unacked
sweep runs every second (``unacked_restore_interval = throttle = 1``, as the delivery
benchmark has it; kombu's default sweep is every ~100 s, which would only move the
redeliveries later, not prevent them).

Target (issue 21): relier p99 lateness <= 100 ms on an idle machine; 0 duplicate runs.
Timing is reported, never asserted.

    python -m bench.scheduling [--tasks 10000] [--spread 60] [--celery-tasks 200]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.common import percentile, private_redis, setup_django, write_result

VISIBILITY_TIMEOUT_S = 30
LONG_COUNTDOWN_S = (40.0, 60.0)  # above the visibility timeout
TARGET_P99_MS = 100.0
PLAIN_QUEUE = "bench.plain"
BROKER_ENV = {
    "CELERY_VISIBILITY_TIMEOUT": str(VISIBILITY_TIMEOUT_S),
    "CELERY_UNACKED_RESTORE_INTERVAL": "1",
    "CELERY_UNACKED_RESTORE_THROTTLE": "1",
}
VANILLA_ENV = {
    **BROKER_ENV,
    "CELERY_BROKER_TRANSPORT": "redis",  # kombu's own Redis transport
    "RELIER_EMBEDDED_RESURRECTOR": "false",  # relier's scanner runs in the relier worker
}


def _now_ms(client) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def memory_per_task(client, n: int) -> dict:
    """Bytes of ``used_memory`` per scheduled task, ``n`` tasks, no worker running."""
    from testproject.demo.tasks import sched_probe

    later = sched_probe.push_with(countdown=3600)
    before = int(client.info("memory")["used_memory"])
    receipts = [later.push(f"mem-{i}", "mem") for i in range(n)]
    after = int(client.info("memory")["used_memory"])
    from relier_django.core.store.keys import KeySpace

    keys = KeySpace("rl")
    sample = receipts[0].task_id
    out = {
        "tasks": n,
        "used_memory_before": before,
        "used_memory_after": after,
        "bytes_per_task": round((after - before) / n, 1),
        "task_hash_bytes": client.memory_usage(keys.task(sample)),
        "schedule_index_bytes_per_task": round((client.memory_usage(keys.schedule) or 0) / n, 1),
        "in_expiry_index": int(client.zcard(keys.expiry)),
    }
    client.flushall()
    return out


def _parse(entries: list[str]) -> tuple[Counter[str], dict[str, float]]:
    """Runs per label, and each label's first start's lateness in ms."""
    runs: Counter[str] = Counter()
    late: dict[str, float] = {}
    for entry in entries:
        label, _fence, due, started = entry.rsplit(":", 3)
        runs[label] += 1
        lateness = float(int(started) - int(due))
        if label not in late or lateness < late[label]:
            late[label] = lateness
    return runs, late


def _by_tenth(entries: list[str]) -> list[float]:
    """p99 lateness (ms) of each tenth of the run, by due time: where a backlog was."""
    rows = [(int(e.rsplit(":", 3)[2]), int(e.rsplit(":", 3)[3])) for e in entries]
    if not rows:
        return []
    first, last = min(d for d, _ in rows), max(d for d, _ in rows)
    width = max(1, last - first) / 10
    tenths: list[list[float]] = [[] for _ in range(10)]
    for due, started in rows:
        tenths[min(9, int((due - first) / width))].append(float(started - due))
    return [percentile(t, 99) if t else 0.0 for t in tenths]


def _summary(pushed: int, runs: Counter[str], late: dict[str, float]) -> dict:
    values = sorted(late.values())
    return {
        "pushed": pushed,
        "ran": len(runs),
        "runs": sum(runs.values()),
        "duplicate_runs": sum(n - 1 for n in runs.values() if n > 1),
        "tasks_run_twice_or_more": sum(1 for n in runs.values() if n > 1),
        "early": sum(1 for v in values if v < 0),
        "lateness_p50_ms": percentile(values, 50) if values else None,
        "lateness_p99_ms": percentile(values, 99) if values else None,
        "lateness_max_ms": values[-1] if values else None,
        "lateness_min_ms": values[0] if values else None,
    }


def _wait_for(client, key: str, labels: int, until: float) -> None:
    """Until ``key`` lists ``labels`` distinct runs (or ``until``, monotonic)."""
    while time.monotonic() < until:
        if len({e.rsplit(":", 3)[0] for e in client.lrange(key, 0, -1)}) >= labels:
            return
        time.sleep(0.5)


def run(n: int, spread_s: float, long_n: int, seed: int, log_dir: Path) -> dict:
    from bench.delivery import _point_at
    from testproject.celery import app
    from testproject.demo.tasks import sched_probe
    from testproject.harness import CeleryWorker

    rng = random.Random(seed)
    with private_redis() as server:
        setup_django(server.url)
        _point_at(server.url)
        client = server.client(decode_responses=True)
        memory = memory_per_task(client, n)
        print(f"memory: {memory['bytes_per_task']:.0f} B per scheduled task", flush=True)
        relier = CeleryWorker(server.url, log_dir, name="sched-relier", extra_env=BROKER_ENV)
        vanilla = CeleryWorker(server.url, log_dir, name="sched-vanilla",
                               queues=(PLAIN_QUEUE,), extra_env=VANILLA_ENV)  # fmt: skip
        workers = [relier.start(), vanilla.start()]
        try:
            pushed_at = time.monotonic()
            for i in range(long_n):
                countdown = rng.uniform(*LONG_COUNTDOWN_S)
                sched_probe.push_with(countdown=countdown).push(f"long-{i}", "long")
                app.send_task("demo.plain_sched", args=[f"celery-{i}", "celery"],
                              countdown=countdown, queue=PLAIN_QUEUE)  # fmt: skip
            t0 = time.monotonic()
            for i in range(n):
                sched_probe.push_with(countdown=rng.uniform(1.0, spread_s)).push(f"s-{i}", "spread")
            push_s = time.monotonic() - t0
            print(f"pushed {n} spread tasks in {push_s:.1f} s", flush=True)
            _wait_for(client, "demo:sched:spread", n, t0 + spread_s + 120)
            # Past the last long countdown, and then some: redeliveries run at the ETA.
            settle = pushed_at + LONG_COUNTDOWN_S[1] + 10
            _wait_for(client, "demo:sched:long", long_n, settle + 60)
            _wait_for(client, "demo:plain_sched:celery", long_n, settle + 60)
            time.sleep(max(0.0, settle - time.monotonic()))
            spread_entries = client.lrange("demo:sched:spread", 0, -1)
            results = {
                group: _summary(pushed, *_parse(client.lrange(key, 0, -1)))
                for group, key, pushed in (
                    (f"relier, 1-{spread_s:g} s", "demo:sched:spread", n),
                    ("relier, 40-60 s", "demo:sched:long", long_n),
                    ("celery ETA, 40-60 s", "demo:plain_sched:celery", long_n),
                )
            }
        finally:
            for worker in workers:
                worker.stop()
    return {"memory": memory, "push_s": round(push_s, 2), "groups": results,
            "spread_p99_ms_by_tenth": _by_tenth(spread_entries)}  # fmt: skip


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000, help="scheduled relier tasks")
    parser.add_argument("--spread", type=float, default=60.0,
                        help="countdowns are uniform over 1 s to this many seconds")  # fmt: skip
    parser.add_argument("--celery-tasks", type=int, default=200,
                        help="tasks per side with a 40-60 s countdown (duplicates)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="relier-scheduling-") as tmp:
        out = run(args.tasks, max(1.0, args.spread), args.celery_tasks, args.seed, Path(tmp))
    spread = next(iter(out["groups"].values()))
    p99 = spread["lateness_p99_ms"]
    relier_dups = sum(g["duplicate_runs"] for k, g in out["groups"].items() if "relier" in k)
    met = p99 is not None and p99 <= TARGET_P99_MS and relier_dups == 0
    data = {
        "benchmark": "scheduling",
        "tasks": args.tasks,
        "spread_s": args.spread,
        "celery_tasks": args.celery_tasks,
        "visibility_timeout_s": VISIBILITY_TIMEOUT_S,
        "target_p99_ms": TARGET_P99_MS,
        **out,
        "target_met": met,
    }
    suffix = "" if (args.tasks, args.spread, args.celery_tasks) == (10_000, 60.0, 200) else "-small"
    path = write_result(f"scheduling{suffix}", data)
    mem = out["memory"]
    print(f"\nscheduled tasks: 1 relier worker + 1 Celery worker (2 processes each), "
          f"visibility timeout {VISIBILITY_TIMEOUT_S} s; {args.tasks} pushed in "
          f"{out['push_s']} s")  # fmt: skip
    head = ("group", "pushed", "ran", "dup runs", "early", "p50 ms", "p99 ms", "max ms")
    print("  " + "".join(f"{h:>22}" if i == 0 else f"{h:>10}" for i, h in enumerate(head)))
    for group, g in out["groups"].items():
        row = (g["pushed"], g["ran"], g["duplicate_runs"], g["early"], g["lateness_p50_ms"],
               g["lateness_p99_ms"], g["lateness_max_ms"])  # fmt: skip
        print(f"  {group:>22}" + "".join(f"{v!s:>10}" for v in row))
    print("relier 1-N s, p99 lateness ms by tenth of the run (due time): "
          + " ".join(f"{v:.0f}" for v in out["spread_p99_ms_by_tenth"]))  # fmt: skip
    print(f"memory per scheduled task: {mem['bytes_per_task']:.0f} B of used_memory "
          f"(task hash {mem['task_hash_bytes']} B, schedule index "
          f"{mem['schedule_index_bytes_per_task']} B per entry)")  # fmt: skip
    print(f"target relier p99 lateness <= {TARGET_P99_MS:g} ms and 0 duplicates: "
          f"{'met' if met else 'MISSED'} (p99 {p99} ms); written to {path}")  # fmt: skip
    return data


if __name__ == "__main__":
    main()
