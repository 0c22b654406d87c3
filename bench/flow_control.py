"""Flow control (issue 38): per-key concurrency through whole-worker kills, the
parked -> running hand-over, a cluster-wide rate, and what the flow-control code costs
tasks that do not use it.

Every figure is counted from the tasks' own records, not from the store's bookkeeping:
each task of testproject/demo/limit_tasks.py writes ``start`` and ``end`` with its key,
label, fence and pid on the Redis clock. Four phases, each printed with its target and
met / MISSED (never asserted: the machine is shared):

- **kills**: ``--tasks`` tasks of ``demo.lim.per_key`` (``concurrency=2`` per key) over
  ``--keys`` keys, pushed at once in a shuffled key order, each ``--work`` seconds long,
  on 2 workers x 2 prefork processes with relier's defaults; ``--kills`` whole-worker
  SIGKILLs spread over the run, the killed worker started again at once (a
  supervisor). The most runs of one key at once (target: never above 2): a run a kill
  cut short counts as running until the kill. A killed run keeps its slot through its
  resurrection, so the slot's next start is the killed task's own: kill -> that start,
  p99 (target <= 2 s).
- **hand-over**: ``--handovers`` tasks of one key (``concurrency=2``) pushed at once on
  the same 2 workers, so every task past the first two is parked and the workers have
  processes to spare: a parked task's start minus the end that freed its slot (the
  k-th end frees the (k+2)-th start: ends and starts paired in order), p99 (target
  <= 50 ms). The same figure in the kill phase is printed beside it: there each
  hand-over waits behind the ~100 tasks already dispatched, so it measures the queue.
- **rate**: ``demo.lim.rated`` (``rate="20/s"``) for ``--rate-s`` seconds' worth, pushed
  at once, on the same 2 workers: starts per second past the first window's burst
  (the GCRA lets 20 go at once), target within 5 % of 20/s.
- **throughput**: ``--noop`` no-op tasks (``demo.work``, no limit) on 1 worker x 2, first
  push to last run, on this build and on the build before flow control (the parent of
  the commit that added ``_limits.lua``, in a temporary git worktree; its producer and
  worker both run that build's code); target: this build >= 0.97 x the one before
  (median over ``--rounds`` rounds (7) of the ratio within a round, the order rotating).
  Beside it, the same tasks under ``concurrency=10_000``, a limit never reached
  (testproject/demo/bench_limit_tasks.py): what the gate itself costs a task.

    python -m bench.flow_control            # the full size (python -m bench flow_control)
    python -m bench.flow_control --small    # a quick run: flow_control-small.json
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from bench.common import (
    AS_SHIPPED,
    REPO,
    command_counts,
    diff_counts,
    percentile,
    private_redis,
    setup_django,
    write_result,
)
from bench.delivery import _point_at
from bench.pop_trace import before_checkout
from bench.throughput import _cpu_s, _wait_done

CAPACITY = 2  # demo.lim.per_key's concurrency
RATE_PER_S = 20.0  # demo.lim.rated's rate
TARGETS = {
    "max_per_key": CAPACITY,
    "slot_restart_p99_s": 2.0,
    "handover_p99_ms": 50.0,
    "rate_error": 0.05,
    "now_over_before": 0.97,
}
LIMITS_LUA = "relier_django/core/store/lua/_limits.lua"
DEFAULTS = {"tasks": 1000, "keys": 50, "kills": 5, "work": 0.2, "handovers": 200,
            "rate_s": 60.0, "noop": 2000, "rounds": 7, "seed": 38}  # fmt: skip
SMALL = {"tasks": 100, "keys": 10, "kills": 2, "work": 0.2, "handovers": 30,
         "rate_s": 10.0, "noop": 300, "rounds": 1, "seed": 38}  # fmt: skip


class Record(NamedTuple):
    """One line a limit task wrote: ``start`` or ``end``, on the Redis clock (ms)."""

    kind: str
    key: str
    label: str
    fence: int
    ms: int
    pid: int


class Kill(NamedTuple):
    at_ms: int
    pids: frozenset[int]


def parse(raw: Iterable[str]) -> list[Record]:
    out = []
    for line in raw:
        kind, key, label, fence, ms, pid = line.split(":")
        out.append(Record(kind, key, label, int(fence), int(ms), int(pid)))
    return out


def spans(records: list[Record], kills: list[Kill]) -> list[tuple[str, float, float]]:
    """(key, start, end) of every run: a run with no end ended at the first kill, after
    its start, that took its process; one no kill explains is counted as running to the
    end of time (so it can only raise the most at once)."""
    ends = {(r.label, r.fence): r.ms for r in records if r.kind == "end"}
    out = []
    for r in records:
        if r.kind != "start":
            continue
        end = ends.get((r.label, r.fence))
        if end is None:
            end = min((k.at_ms for k in kills if r.pid in k.pids and k.at_ms >= r.ms),
                      default=float("inf"))  # fmt: skip
        out.append((r.key, float(r.ms), float(end)))
    return out


def most_at_once(runs: list[tuple[str, float, float]]) -> dict[str, int]:
    """Per key, the most runs that had started and not ended at one instant (an end at
    the instant of another's start is counted first: its slot was freed before)."""
    events = sorted([(end, 0, key) for key, _, end in runs] + [(s, 1, key) for key, s, _ in runs])
    running: dict[str, int] = defaultdict(int)
    most: dict[str, int] = defaultdict(int)
    for _, starts, key in events:
        running[key] += 1 if starts else -1
        most[key] = max(most[key], running[key])
    return dict(most)


def slot_restarts(records: list[Record], kills: list[Kill]) -> tuple[list[float], int]:
    """Seconds from each kill to the next start of each run it cut short (the task
    keeps its slot through its resurrection: that start is the slot's next), and how
    many cut-short runs never started again."""
    ended = {(r.label, r.fence) for r in records if r.kind == "end"}
    starts: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        if r.kind == "start":
            starts[r.label].append(r)
    waits, never = [], 0
    for kill in kills:
        for r in (r for rs in starts.values() for r in rs):
            if r.pid not in kill.pids or r.ms > kill.at_ms or (r.label, r.fence) in ended:
                continue
            later = [s.ms for s in starts[r.label] if s.fence > r.fence]
            if later:
                waits.append((min(later) - kill.at_ms) / 1000)
            else:
                never += 1
    return waits, never


def ended_twice(records: list[Record], kills: list[Kill]) -> tuple[int, int]:
    """Tasks that recorded an end more than once, and how many of those a kill
    explains: the process that recorded an earlier end was killed after it, before its
    commit (a task records its end just before committing), so the task ran again."""
    ends: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        if r.kind == "end":
            ends[r.label].append(r)
    twice = [sorted(rs, key=lambda r: r.ms) for rs in ends.values() if len(rs) > 1]
    explained = sum(
        1
        for rs in twice
        if all(any(r.pid in k.pids and k.at_ms >= r.ms for k in kills) for r in rs[:-1])
    )
    return len(twice), explained


def handovers(records: list[Record], capacity: int = CAPACITY) -> list[float]:
    """Milliseconds from the end that freed a slot to the start of the parked task it
    was handed to, per key, for keys whose tasks were all pushed at once (every start
    past the first ``capacity`` was parked): the k-th end frees the (k + capacity)-th
    start. A key with a run cut short (a resurrection keeps its slot, it frees none)
    or run twice is left out."""
    by_key: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by_key[r.key].append(r)
    out: list[float] = []
    for key_records in by_key.values():
        starts = sorted(r.ms for r in key_records if r.kind == "start")
        ends = sorted(r.ms for r in key_records if r.kind == "end")
        if len(starts) != len(ends) or any(r.fence != 1 for r in key_records):
            continue
        out += [float(s - e) for s, e in zip(starts[capacity:], ends, strict=False)]
    return out


def rate_figures(starts_ms: list[int], burst: int, per_s: float) -> dict[str, Any]:
    """Starts per second past the first ``burst`` (which the GCRA lets go at once), and
    the fewest and most in any whole 10 s window of that span."""
    ordered = sorted(starts_ms)
    steady = ordered[burst:]
    if len(steady) < 2:
        return {"starts": len(ordered), "per_s": None, "error": None, "windows_per_s": []}
    span_s = (steady[-1] - steady[0]) / 1000
    achieved = (len(steady) - 1) / span_s
    windows = []
    at = steady[0]
    while at + 10_000 <= steady[-1]:
        windows.append(sum(1 for s in steady if at <= s < at + 10_000) / 10)
        at += 10_000
    return {
        "starts": len(ordered),
        "steady_span_s": round(span_s, 2),
        "per_s": round(achieved, 3),
        "error": round(achieved / per_s - 1, 4),
        "windows_per_s": windows,
    }


def _spread(values: list[float], digits: int = 3) -> dict[str, Any]:
    if not values:
        return {"n": 0, "p50": None, "p99": None, "max": None}
    return {
        "n": len(values),
        "p50": round(percentile(values, 50), digits),
        "p99": round(percentile(values, 99), digits),
        "max": round(max(values), digits),
    }


def _records(client, run: str) -> list[Record]:  # type: ignore[no-untyped-def]
    return parse(client.lrange(f"demo:lim:{run}", 0, -1))


def _wait_ended(client, run: str, labels: set[str], timeout_s: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ended = {r.label for r in _records(client, run) if r.kind == "end"}
        if labels <= ended:
            return
        time.sleep(0.25)
    missing = len(labels - {r.label for r in _records(client, run) if r.kind == "end"})
    print(f"  {missing} of {len(labels)} tasks had not ended in {timeout_s:.0f} s", flush=True)


def _limit_keys_left(client, timeout_s: float = 30) -> list[str]:  # type: ignore[no-untyped-def]
    """The rl:lim:* keys (slots, lines; a rate's :tat expires by itself) still there
    ``timeout_s`` after the last end at most: none once every commit ran."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = sorted(k for k in client.keys("rl:lim:*") if not k.endswith(":tat"))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.25)


def _kill(victim) -> Kill:  # type: ignore[no-untyped-def]
    """SIGKILL a whole worker (main and pool processes), start it again at once."""
    pids = frozenset({victim.pid, *(p.pid for p in victim.children())})
    at_ms = int(time.time() * 1000)
    victim.kill()
    victim.start()  # the supervisor
    return Kill(at_ms, pids)


def kill_phase(client, workers: list, args: argparse.Namespace) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    from testproject.demo import limit_tasks

    rng = random.Random(args.seed)
    keys = [f"k{i}" for i in range(args.keys)]
    order = [keys[i % args.keys] for i in range(args.tasks)]
    rng.shuffle(order)
    run = "kills"
    labels = [f"t{i}" for i in range(args.tasks)]
    t0 = time.monotonic()
    for label, key in zip(labels, order, strict=True):
        limit_tasks.per_key.push(run, key, label, args.work)
    pushed_s = time.monotonic() - t0
    # Spread over the run's length if nothing were killed (4 processes), later kills
    # skipped once every task has ended.
    gap = args.tasks * args.work / 4 / (args.kills + 1)
    kills: list[Kill] = []
    for k in range(args.kills):
        time.sleep(max(0.0, t0 + pushed_s + gap * (k + 1) - time.monotonic()))
        if len({r.label for r in _records(client, run) if r.kind == "end"}) >= args.tasks:
            break
        kills.append(_kill(workers[k % 2]))
        print(f"  kill {k + 1}: {len(kills[-1].pids)} processes", flush=True)
    _wait_ended(client, run, set(labels), timeout_s=args.tasks * args.work * 2 + 120)
    elapsed = time.monotonic() - t0
    records = _records(client, run)
    most = most_at_once(spans(records, kills))
    waits, never = slot_restarts(records, kills)
    twice, explained = ended_twice(records, kills)
    return {
        "tasks": args.tasks, "keys": args.keys, "work_s": args.work, "kills": len(kills),
        "elapsed_s": round(elapsed, 1), "push_s": round(pushed_s, 2),
        "ended": len({r.label for r in records if r.kind == "end"}),
        "ended_twice": twice, "ended_twice_killed_before_commit": explained,
        "runs_cut_short": len(waits) + never,
        "max_per_key": max(most.values(), default=0), "keys_at_max": sum(
            1 for v in most.values() if v == max(most.values(), default=0)),
        "slot_restart_s": _spread(waits), "slot_restart_never": never,
        "slot_restart_latencies_s": sorted(round(w, 3) for w in waits),
        "handover_with_queue_ms": _spread(handovers(records), 1),
        "limit_keys_left": _limit_keys_left(client),
    }  # fmt: skip


def idle_dispatch(client, n: int) -> dict[str, dict[str, Any]]:  # type: ignore[no-untyped-def]
    """Push -> start on idle workers, one task at a time, alternating: ``demo.work`` (no
    limit: the push queues it) and ``demo.lim.per_key`` with a key of its own (a free
    slot, taken at push; the scanner leader dispatches it). Beside the hand-over, it
    tells the dispatch path's share from the hand-over's own."""
    from testproject.demo import limit_tasks
    from testproject.demo.tasks import work

    waits: dict[str, list[float]] = {"no limit": [], "free slot": []}
    for i in range(n):
        pushed = time.time()
        work.push(f"idle-{i}", 0.0)
        _wait_done(client, [f"idle-{i}"], 30)
        started = client.lrange(f"demo:start:idle-{i}", 0, 0)[0].split(":")[1]
        waits["no limit"].append((float(started) - pushed) * 1000)
        pushed = time.time()
        limit_tasks.per_key.push("idle", f"i{i}", f"i{i}", 0.0)
        _wait_ended(client, "idle", {f"i{i}"}, 30)
        started_ms = next(r.ms for r in _records(client, "idle") if r.label == f"i{i}")
        waits["free slot"].append(started_ms - pushed * 1000)
    return {name: _spread(values, 1) for name, values in waits.items()}


def handover_phase(client, n: int) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    from testproject.demo import limit_tasks

    run = "handover"
    labels = [f"h{i}" for i in range(n)]
    for label in labels:
        limit_tasks.per_key.push(run, "h", label, 0.05)
    _wait_ended(client, run, set(labels), timeout_s=n * 0.5 + 60)
    records = _records(client, run)
    latencies = handovers(records)
    return {
        "tasks": n,
        "work_s": 0.05,
        "handover_ms": _spread(latencies, 1),
        "max_at_once": max(most_at_once(spans(records, [])).values(), default=0),
        "handover_latencies_ms": sorted(latencies),
        "push_to_start_idle_ms": idle_dispatch(client, 20),
        "limit_keys_left": _limit_keys_left(client),
    }


def rate_phase(client, seconds: float) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    from testproject.demo import limit_tasks

    run = "rate"
    burst = int(RATE_PER_S)
    labels = [f"r{i}" for i in range(int(RATE_PER_S * seconds) + burst)]
    for label in labels:
        limit_tasks.rated.push(run, label)
    _wait_ended(client, run, set(labels), timeout_s=seconds * 2 + 60)
    starts = [r.ms for r in _records(client, run) if r.kind == "start"]
    return {"rate": f"{RATE_PER_S:g}/s", "tasks": len(labels), "burst": burst,
            **rate_figures(starts, burst, RATE_PER_S)}  # fmt: skip


def limited_phases(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    """The kills, then the hand-over and the rate, on one private Redis and one pair of
    workers (2 prefork processes each, relier's defaults as shipped)."""
    from testproject.harness import CeleryWorker

    with private_redis() as server:
        setup_django(server.url)
        _point_at(server.url)
        client = server.client(decode_responses=True)
        workers = [CeleryWorker(server.url, log_dir, name=f"fc-w{i}", concurrency=2,
                                extra_env=AS_SHIPPED).start() for i in range(2)]  # fmt: skip
        try:
            print(f"kills: {args.tasks} tasks, {args.keys} keys, {args.kills} kills", flush=True)
            kills = kill_phase(client, workers, args)
            print(f"hand-over: {args.handovers} tasks of one key", flush=True)
            hand = handover_phase(client, args.handovers)
            print(f"rate: {RATE_PER_S:g}/s for {args.rate_s:g} s", flush=True)
            rate = rate_phase(client, args.rate_s)
        finally:
            for worker in workers:
                worker.stop()
    return {"kills": kills, "handover": hand, "rate": rate}


# The producer of a throughput run, in a process of the build under test (its cwd and
# PYTHONPATH): it pushes one task, says it is ready (with where relier_django came
# from, so a run on the wrong build is caught), then pushes the rest on "go".
PRODUCER = """
import importlib, sys
import django
django.setup()
import relier_django
module, _, name = sys.argv[1].partition(":")
task = getattr(importlib.import_module(module), name)
n, prefix = int(sys.argv[2]), sys.argv[3]
task.push(prefix + "-0", 0.0)
print("ready", relier_django.__file__, flush=True)
sys.stdin.readline()
for i in range(1, n):
    task.push(prefix + "-" + str(i), 0.0)
print("pushed", flush=True)
"""

# contender -> (task, build): "before" is the build before flow control.
CONTENDERS = {
    "now": ("testproject.demo.tasks:work", "now"),
    "before": ("testproject.demo.tasks:work", "before"),
    "limit_never_reached": ("testproject.demo.bench_limit_tasks:wide", "now"),
}


def throughput_run(task: str, code: Path, n: int, log_dir: Path, name: str) -> dict[str, float]:
    """``n`` no-op tasks of ``task`` on the build at ``code`` (producer and worker),
    first push past the warm-up one to the last run: tasks per second; the CPU ms per
    task of the producer, the worker (main and pool processes) and redis-server
    together, which a loaded machine moves less than a rate; redis-server's own CPU
    µs per task; and the commands Redis ran per task (scripts counted as their inner
    commands too, as ``INFO commandstats`` does; the bench's own polls left out),
    which the machine's load does not move at all."""
    from testproject.harness import CeleryWorker, worker_env

    env = {**AS_SHIPPED, "PYTHONPATH": str(code)}
    labels = [f"{name}-{i}" for i in range(n)]
    with private_redis() as server:
        client = server.client(decode_responses=True)
        worker = CeleryWorker(server.url, log_dir, name=f"tp-{name}", concurrency=2,
                              extra_env=env, cwd=code).start()  # fmt: skip
        producer = subprocess.Popen(
            [sys.executable, "-c", PRODUCER, task, str(n), name], cwd=code,
            env=worker_env(server.url, env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            assert producer.stdin is not None and producer.stdout is not None
            ready = producer.stdout.readline().split()
            if ready[:1] != ["ready"] or not ready[1].startswith(str(code)):
                raise RuntimeError(f"{name}: the producer did not run {code}'s code: {ready}")
            _wait_done(client, labels[:1], 60)
            pids = [producer.pid, server.pid, worker.pid, *(p.pid for p in worker.children())]
            cpu, redis_cpu, commands = _cpu_s(pids), _cpu_s([server.pid]), command_counts(client)
            t0 = time.perf_counter()
            producer.stdin.write("go\n")
            producer.stdin.flush()
            _wait_done(client, labels[1:], 600)
            elapsed = time.perf_counter() - t0
            cpu, redis_cpu = _cpu_s(pids) - cpu, _cpu_s([server.pid]) - redis_cpu
            used = diff_counts(command_counts(client), commands)
            producer.wait(60)
        finally:
            if producer.poll() is None:
                producer.kill()
                producer.wait()
            worker.stop()
    own = {"llen", "info"}  # the bench's progress polls and its counting
    return {
        "tasks_per_s": (n - 1) / elapsed,
        "cpu_ms": cpu * 1000 / (n - 1),
        "redis_cpu_us": redis_cpu * 1e6 / (n - 1),
        "commands": sum(v for k, v in used.items() if k not in own) / (n - 1),
        "scripts": (used.get("evalsha", 0) + used.get("eval", 0)) / (n - 1),
    }


def throughput_phase(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in CONTENDERS}
    with before_checkout(LIMITS_LUA) as before:
        builds = {"now": REPO, "before": before}
        for r in range(args.rounds):
            names = list(CONTENDERS)
            for contender in names[r % 3 :] + names[: r % 3]:  # rotate: drift hits all
                task, build = CONTENDERS[contender]
                found = throughput_run(task, builds[build], args.noop, log_dir, contender)
                runs[contender].append(found)
                print(f"  round {r + 1} {contender:<20} {found['tasks_per_s']:8.1f} tasks/s, "
                      f"{found['cpu_ms']:.3f} CPU ms, {found['redis_cpu_us']:.0f} redis µs, "
                      f"{found['commands']:.2f} commands per task", flush=True)  # fmt: skip

    def median(contender: str, figure: str, digits: int) -> float:
        return round(statistics.median(run[figure] for run in runs[contender]), digits)

    def ratio(a: str, b: str, figure: str) -> float:
        pairs = zip(runs[a], runs[b], strict=True)
        return round(statistics.median(x[figure] / y[figure] for x, y in pairs), 4)

    return {
        "tasks": args.noop, "rounds": args.rounds,
        "tasks_per_s": {c: median(c, "tasks_per_s", 1) for c in CONTENDERS},
        "cpu_ms_per_task": {c: median(c, "cpu_ms", 3) for c in CONTENDERS},
        "redis_cpu_us_per_task": {c: median(c, "redis_cpu_us", 1) for c in CONTENDERS},
        "redis_commands_per_task": {c: median(c, "commands", 2) for c in CONTENDERS},
        "redis_scripts_per_task": {c: median(c, "scripts", 2) for c in CONTENDERS},
        "all_rounds": {c: [{k: round(v, 3) for k, v in run.items()} for run in runs[c]]
                       for c in CONTENDERS},
        "now_over_before": ratio("now", "before", "tasks_per_s"),
        "cpu_now_over_before": ratio("now", "before", "cpu_ms"),
        "redis_cpu_now_over_before": ratio("now", "before", "redis_cpu_us"),
        "limit_never_reached_over_now": ratio("limit_never_reached", "now", "tasks_per_s"),
        "cpu_limit_never_reached_over_now": ratio("limit_never_reached", "now", "cpu_ms"),
    }  # fmt: skip


def verdicts(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each figure of the issue with its target and whether it was met."""
    kills, hand, rate, tp = (result[k] for k in ("kills", "handover", "rate", "throughput"))
    restart = kills["slot_restart_s"]["p99"]
    out = [
        ("most runs of one key at once (kills)", kills["max_per_key"],
         f"<= {TARGETS['max_per_key']}", kills["max_per_key"] <= TARGETS["max_per_key"]),
        ("kill -> the killed task's slot runs again, p99 s", restart,
         f"<= {TARGETS['slot_restart_p99_s']}",
         restart is not None and kills["slot_restart_never"] == 0
         and restart <= TARGETS["slot_restart_p99_s"]),
        ("parked -> running hand-over, p99 ms", hand["handover_ms"]["p99"],
         f"<= {TARGETS['handover_p99_ms']:g}",
         hand["handover_ms"]["p99"] is not None
         and hand["handover_ms"]["p99"] <= TARGETS["handover_p99_ms"]),
        (f"rate {rate['rate']}: starts per second", rate["per_s"],
         f"{RATE_PER_S:g} +- {TARGETS['rate_error']:.0%}",
         rate["error"] is not None and abs(rate["error"]) <= TARGETS["rate_error"]),
        ("no-op tasks with no limit, this build / before flow control", tp["now_over_before"],
         f">= {TARGETS['now_over_before']}", tp["now_over_before"] >= TARGETS["now_over_before"]),
    ]  # fmt: skip
    return [{"figure": f, "measured": m, "target": t, "met": bool(ok)} for f, m, t, ok in out]


def report(result: dict[str, Any]) -> None:
    kills, hand, rate, tp = (result[k] for k in ("kills", "handover", "rate", "throughput"))
    print(f"\nkills: {kills['ended']}/{kills['tasks']} tasks ended ({kills['ended_twice']} twice, "
          f"{kills['ended_twice_killed_before_commit']} of them killed before their commit) "
          f"in {kills['elapsed_s']} s, {kills['kills']} whole-worker kills, "
          f"{kills['runs_cut_short']} runs cut short")  # fmt: skip
    print(f"  most at once per key: {kills['max_per_key']} ({kills['keys_at_max']} keys at it)")
    print(f"  kill -> slot's next start: {kills['slot_restart_s']} "
          f"(never: {kills['slot_restart_never']})")  # fmt: skip
    print(f"  end -> next start of the key, queue wait included: {kills['handover_with_queue_ms']}")
    print(f"  rl:lim:* keys left: {kills['limit_keys_left'] or 'none'}")
    print(f"hand-over (1 key, processes to spare): {hand['handover_ms']} ms, at most "
          f"{hand['max_at_once']} at once")  # fmt: skip
    for name, spread in hand["push_to_start_idle_ms"].items():
        print(f"  push -> start on idle workers, {name}: {spread} ms")
    print(f"  rl:lim:* keys left: {hand['limit_keys_left'] or 'none'}")
    print(f"rate {rate['rate']}: {rate['starts']} starts, {rate['per_s']}/s over "
          f"{rate.get('steady_span_s')} s past the burst; "
          f"10 s windows: {rate['windows_per_s']}")  # fmt: skip
    print(f"throughput, medians over {tp['rounds']} round(s): tasks/s {tp['tasks_per_s']}")
    print(f"  CPU ms per task (producer + worker + redis-server): {tp['cpu_ms_per_task']}")
    print(f"  redis-server CPU µs per task: {tp['redis_cpu_us_per_task']}")
    print(f"  Redis commands per task: {tp['redis_commands_per_task']}, "
          f"of them scripts: {tp['redis_scripts_per_task']}")  # fmt: skip
    print(f"  this build / before: tasks/s {tp['now_over_before']}, CPU per task "
          f"{tp['cpu_now_over_before']}, redis-server CPU per task "
          f"{tp['redis_cpu_now_over_before']}")  # fmt: skip
    print(f"  limit never reached / no limit: tasks/s {tp['limit_never_reached_over_now']}, "
          f"CPU per task {tp['cpu_limit_never_reached_over_now']}")  # fmt: skip
    print("\nfigure | measured | target | verdict")
    for v in result["targets"]:
        print(f"{v['figure']} | {v['measured']} | {v['target']} | "
              f"{'met' if v['met'] else 'MISSED'}")  # fmt: skip


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help=f"the quick sizes: {SMALL}")
    for name, value in DEFAULTS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=None)
    args = parser.parse_args()
    base = SMALL if args.small else DEFAULTS
    for name, value in base.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    sizes = {name: getattr(args, name) for name in DEFAULTS}
    with tempfile.TemporaryDirectory(prefix="relier-flow-") as tmp:
        log_dir = Path(tmp)
        result: dict[str, Any] = {"sizes": sizes, **limited_phases(args, log_dir)}
        print(f"throughput: {args.noop} no-op tasks, {args.rounds} round(s)", flush=True)
        result["throughput"] = throughput_phase(args, log_dir)
    result["targets"] = verdicts(result)
    report(result)
    path = write_result("flow_control" if sizes == DEFAULTS else "flow_control-small", result)
    print(f"results: {path}")
    return result


if __name__ == "__main__":
    main()
