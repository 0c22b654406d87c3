"""Delivery under kills: vanilla Celery, Celery with acks_late + reject_on_worker_lost,
and relier_django, in the same run, on the same machine, with the same work.

Each contender gets a fresh private Redis, 2 workers x 2 prefork processes (4 in all),
the same tasks (0.5 s of work each), the same kill schedule (alternating SIGKILL of
one busy pool process and SIGKILL of a whole worker) and a supervisor that restarts
a killed worker at once. Every contender runs with the same, short, broker visibility
timeout (so acks_late gets its redeliveries within the run) and the run goes on past
it before duplicates are counted. relier_django runs with its default heartbeat TTL
(10 s) and scan interval (2 s).

Counted from Redis, per task: starts (with times) and completed runs; for relier
also commits (from the workers' logs). Recovery latency: from the kill that took the
process running a task to the task's next start (queueing included); for relier_django
also to its re-dispatch (the resurrector's log line, once the broker accepted it).

    python -m bench.delivery [--tasks 500 --kills 5] [--big]
"""

from __future__ import annotations

import argparse
import itertools
import random
import re
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.common import percentile, private_redis, setup_django, write_result

VISIBILITY_TIMEOUT_S = 20
WORK_S = 0.5
RELIER_TTL_S = 10.0
RELIER_SCAN_S = 2.0
# Celery's contenders run on kombu's own Redis transport; relier_django on its own
# (the testproject's default, docs/settings.md), as its users are told to.
KOMBU_TRANSPORT = {"CELERY_BROKER_TRANSPORT": "redis"}
CONTENDERS = {
    "vanilla": ("demo.plain_work", KOMBU_TRANSPORT),
    "acks_late": (
        "demo.plain_work",
        {
            **KOMBU_TRANSPORT,
            "CELERY_TASK_ACKS_LATE": "true",
            "CELERY_TASK_REJECT_ON_WORKER_LOST": "true",
        },
    ),
    "relier": ("demo.work", {}),
}
COMMON_ENV = {
    "CELERY_VISIBILITY_TIMEOUT": str(VISIBILITY_TIMEOUT_S),
    "CELERY_UNACKED_RESTORE_INTERVAL": "1",
    "CELERY_UNACKED_RESTORE_THROTTLE": "1",
    "RELIER_HEARTBEAT_TTL_S": str(RELIER_TTL_S),
    "RELIER_SCAN_INTERVAL_S": str(RELIER_SCAN_S),
}


def push_all(contender: str, task: str, labels: list[str], sleep_s: float = WORK_S) -> list[str]:
    """Push one task per label; returns the task ids (relier_django's receipts; Celery's
    own for the others)."""
    from testproject.celery import app
    from testproject.demo.tasks import work

    if contender == "relier":
        return [work.push(label, sleep_s).task_id for label in labels]
    return [app.send_task(task, args=[label, sleep_s]).id for label in labels]


Start = tuple[float, int]  # (time, pid of the pool process that ran it)
Kill = tuple[float, frozenset[int]]  # (time, every pid the SIGKILL took)


def snapshot(client, labels: list[str]) -> tuple[list[int], list[list[Start]]]:
    pipe = client.pipeline()
    for label in labels:
        pipe.llen(f"demo:exec:{label}")
        pipe.lrange(f"demo:start:{label}", 0, -1)
    replies = pipe.execute()
    runs = replies[0::2]
    starts = [
        [(float(s.split(":")[1]), int(s.split(":")[2])) for s in entry] for entry in replies[1::2]
    ]
    return runs, starts


def run_contender(
    contender: str, n: int, kills: int, seed: int, log_dir: Path, prefetch: int
) -> dict:
    from testproject.harness import CeleryWorker

    task, extra = CONTENDERS[contender]
    rng = random.Random(seed)
    labels = [f"{contender}-{i}" for i in range(n)]
    with private_redis() as server:
        setup_django(server.url)
        _point_at(server.url)
        client = server.client(decode_responses=True)
        env = {**COMMON_ENV, "CELERY_WORKER_PREFETCH_MULTIPLIER": str(prefetch), **extra}
        workers = [
            CeleryWorker(server.url, log_dir, name=f"{contender}-w{i}", extra_env=env).start()
            for i in range(2)
        ]
        t0 = time.time()
        ids = push_all(contender, task, labels)
        expected_s = n * WORK_S / 4
        kill_times: list[Kill] = []
        for k in range(kills):
            time.sleep(expected_s / (kills + 1))
            victim = workers[rng.randrange(2)]
            if k % 2 == 0 and victim.children():
                took = {victim.kill_child(rng.choice(victim.children()).pid)}
                kill_times.append((time.time(), frozenset(took)))
            else:
                took = {victim.pid, *(p.pid for p in victim.children())}
                victim.kill()
                kill_times.append((time.time(), frozenset(took)))
                victim.start()  # the supervisor
        # Quiet = every task ran, or nothing new for longer than any recovery path.
        settle_s = VISIBILITY_TIMEOUT_S + RELIER_TTL_S + 15
        last, quiet_since = -1, time.monotonic()
        while True:
            done = sum(1 for r in snapshot(client, labels)[0] if r)
            if done != last:
                last, quiet_since = done, time.monotonic()
            if time.monotonic() - quiet_since > settle_s:
                break
            if done == n:
                time.sleep(VISIBILITY_TIMEOUT_S + 5)  # past the visibility timeout
                break
            time.sleep(0.5)
        runs, starts = snapshot(client, labels)
        elapsed = time.time() - t0
        for worker in workers:
            worker.stop()
        logs = "".join(w.log_path.read_text(errors="replace") for w in workers)
    commits = Counter(re.findall(r"committed task_id=(\w+)", logs))
    latencies = recovery_latencies(starts, kill_times)
    by_kill = redispatch_latencies(starts, kill_times, ids, logs)
    redispatched = [latency for latency, _ in by_kill]
    delivered = sum(1 for r in runs if r)
    return {
        "tasks": n,
        "kills": kills,
        "delivered": delivered,
        "delivered_pct": round(100 * delivered / n, 2),
        "lost": n - delivered,
        "executed_twice": sum(1 for r in runs if r > 1),
        "committed_twice": (
            sum(1 for c in commits.values() if c > 1)
            if contender == "relier"
            else sum(1 for r in runs if r > 1)
        ),
        "recovery_p50_s": round(percentile(latencies, 50), 2) if latencies else None,
        "recovery_p99_s": round(percentile(latencies, 99), 2) if latencies else None,
        "recoveries": len(latencies),
        "recovery_latencies_s": [round(v, 3) for v in sorted(latencies)],
        "redispatch_p50_s": round(percentile(redispatched, 50), 2) if redispatched else None,
        "redispatch_p99_s": round(percentile(redispatched, 99), 2) if redispatched else None,
        "redispatch_latencies_s": [round(v, 3) for v in sorted(redispatched)],
        # The two paths apart: a pool process's death is handed off by its worker's
        # main process at once; a whole worker's is found when its heartbeats expire.
        "redispatch_pool_process_kill_s": sorted(round(v, 3) for v, n in by_kill if n == 1),
        "redispatch_whole_worker_kill_s": sorted(round(v, 3) for v, n in by_kill if n > 1),
        "elapsed_s": round(elapsed, 1),
    }


def interruptions(
    starts: list[list[Start]], kill_times: list[Kill]
) -> list[tuple[int, float, float]]:
    """(task index, kill time, restart time) for each run a kill interrupted: the first
    kill, after the run started, that took the process running it; the restart is the
    task's next start."""
    out = []
    for index, task_starts in enumerate(starts):
        for (previous, pid), (restart, _) in itertools.pairwise(sorted(task_starts)):
            hits = [at for at, pids in kill_times if pid in pids and previous <= at <= restart]
            if hits:
                out.append((index, hits[0], restart))
    return out


def recovery_latencies(starts: list[list[Start]], kill_times: list[Kill]) -> list[float]:
    """For each run a kill interrupted: from that kill to the task's next start, which
    includes the wait in the queue behind the work already there."""
    return [restart - killed for _, killed, restart in interruptions(starts, kill_times)]


_RESURRECTED = re.compile(  # the testproject's log format: "<asctime> WARNING <logger> <msg>"
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) WARNING relier_django\.resurrector "
    r"resurrected task_id=(\w+) ",
    re.MULTILINE,
)


def redispatch_latencies(
    starts: list[list[Start]], kill_times: list[Kill], ids: list[str], logs: str
) -> list[tuple[float, int]]:
    """For each run a kill interrupted and relier_django resurrected: from that kill to
    the re-dispatch (the resurrector's ``resurrected`` log line, written once the
    broker accepted the message), with how many processes the kill took (1: a pool
    process; more: a whole worker). Detection and publish only: what the TTL + scan
    bound covers, without the queueing after it."""
    sent: dict[str, list[float]] = {}
    for stamp, task_id in _RESURRECTED.findall(logs):
        local = time.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S")
        sent.setdefault(task_id, []).append(time.mktime(local) + int(stamp[20:]) / 1000)
    took = {at: len(pids) for at, pids in kill_times}
    out = []
    for index, killed, restart in interruptions(starts, kill_times):
        after = [at for at in sent.get(ids[index], []) if killed <= at <= restart + 1]
        if after:
            out.append((min(after) - killed, took[killed]))
    return out


def _point_at(url: str) -> None:
    from relier_django import conf
    from testproject.celery import app
    from testproject.harness import reset_celery_connections

    app.conf.broker_url = url
    reset_celery_connections(app)

    conf.get_config.cache_clear()


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--big", action="store_true", help="also 2,000 tasks with 10 kills")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--prefetch-multiplier", type=int, default=4,
        help="Celery's worker_prefetch_multiplier, the same for every contender (default 4)",
    )  # fmt: skip
    parser.add_argument("--only", nargs="*", choices=list(CONTENDERS), help="run only these")
    parser.add_argument(
        "--keep-logs", type=Path, metavar="DIR",
        help="write the workers' logs under DIR (one directory per round) and keep them",
    )  # fmt: skip
    args = parser.parse_args()
    rounds = [(args.tasks, args.kills)] + ([(2000, 10)] if args.big else [])
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="relier-delivery-") as tmp:
        for n, kills in rounds:
            for contender in args.only or CONTENDERS:
                key = f"{contender}/{n}x{kills}"
                logs = (args.keep_logs or Path(tmp)) / f"{contender}-{n}x{kills}"
                print(f"running {key} … (logs: {logs})", flush=True)
                results[key] = run_contender(
                    contender, n, kills, args.seed, logs, args.prefetch_multiplier
                )
    target_p99 = RELIER_TTL_S + RELIER_SCAN_S + 1
    out = {
        "benchmark": "delivery",
        "work_s": WORK_S,
        "visibility_timeout_s": VISIBILITY_TIMEOUT_S,
        "relier_ttl_s": RELIER_TTL_S,
        "relier_scan_s": RELIER_SCAN_S,
        "prefetch_multiplier": args.prefetch_multiplier,
        "target_recovery_p99_s": target_p99,
        "results": results,
    }
    suffix = (
        ""
        if args.prefetch_multiplier == 4 and not args.only
        else (
            f"-prefetch{args.prefetch_multiplier}"
            + (f"-{'-'.join(args.only)}" if args.only else "")
        )
    )
    path = write_result(f"delivery{suffix}", out)
    print(
        f"\ndelivery under kills (0.5 s tasks, 4 processes, visibility timeout "
        f"{VISIBILITY_TIMEOUT_S} s, relier TTL {RELIER_TTL_S:g} s / scan {RELIER_SCAN_S:g} s)"
    )
    head = ("run", "delivered %", "lost", "exec 2x", "commit 2x", "rec p50 s", "rec p99 s",
            "sent p50 s", "sent p99 s")  # fmt: skip
    print("  " + "  ".join(f"{h:>12}" for h in head))
    for key, r in results.items():
        row = (key, r["delivered_pct"], r["lost"], r["executed_twice"], r["committed_twice"],
               r["recovery_p50_s"], r["recovery_p99_s"], r["redispatch_p50_s"],
               r["redispatch_p99_s"])  # fmt: skip
        print("  " + "  ".join(f"{v!s:>12}" for v in row))
    print(
        f"  target for relier: 100.0 % delivered, 0 committed twice, recovery p99 <= "
        f"{target_p99:g} s (rec: kill -> running again; sent: kill -> re-dispatched); "
        f"written to {path}"
    )
    return out


if __name__ == "__main__":
    main()
