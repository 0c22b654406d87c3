"""End-to-end throughput: vanilla Celery, Celery with acks_late, relier_django.

Celery's contenders run on kombu's own Redis transport, relier_django on its own
(``relier_django.transport``, what its docs tell users to set), and once more on
kombu's (``relier_kombu``), so the transport's share of the result is measured too.

Each contender gets a fresh private Redis (broker and store), one worker with 2 prefork
processes (the machine's 2 cores), and the same tasks: the delivery benchmark's work
functions (one RPUSH at start and one at the end, so completion can be counted the same
way for everyone), with no sleep ("no-op") and with 10 ms of sleep. The clock runs from
the first push, made from this process while the worker is up, until the last task has
run: pushes, broker, worker and, for relier_django, every Lua script on the way.

Target (issue 8): relier_django >= 0.8 x Celery with acks_late on no-op tasks.

    python -m bench.throughput [--noop 2000] [--sleepy 500] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import psutil

from bench.common import private_redis, setup_django, write_result
from bench.delivery import CONTENDERS as DELIVERY_CONTENDERS
from bench.delivery import KOMBU_TRANSPORT, _point_at, push_all

WORKLOADS = {"no-op": 0.0, "10 ms": 0.01}
# relier_django once more on kombu's own transport: what its transport is worth.
CONTENDERS = {
    **DELIVERY_CONTENDERS,
    "relier_kombu": (DELIVERY_CONTENDERS["relier"][0], KOMBU_TRANSPORT),
}


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` (every thread) so far."""
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def run(contender: str, n: int, sleep_s: float, log_dir: Path) -> tuple[float, dict[str, float]]:
    """Tasks per second for ``n`` tasks of ``sleep_s`` each, first push to last run,
    and the CPU milliseconds per task spent by the producer (this process), the
    worker (main and pool processes) and redis-server over that span."""
    from testproject.harness import CeleryWorker

    task, extra = CONTENDERS[contender]
    pusher = "relier" if contender.startswith("relier") else contender
    labels = [f"{contender}-{i}" for i in range(n)]
    with private_redis() as server:
        setup_django(server.url)
        _point_at(server.url)
        client = server.client(decode_responses=True)
        worker = CeleryWorker(server.url, log_dir, name=f"tp-{contender}", extra_env=extra)
        worker.start()
        try:
            push_all(pusher, task, labels[:1], sleep_s)  # warm both ends
            _wait_done(client, labels[:1], 60)
            worker_pids = [worker.pid, *(p.pid for p in worker.children())]
            before = (_cpu_s([os.getpid()]), _cpu_s(worker_pids), _cpu_s([server.pid]))
            t0 = time.perf_counter()
            push_all(pusher, task, labels[1:], sleep_s)
            _wait_done(client, labels[1:], 600)
            elapsed = time.perf_counter() - t0
            after = (_cpu_s([os.getpid()]), _cpu_s(worker_pids), _cpu_s([server.pid]))
        finally:
            worker.stop()
    per_task = {
        name: round((b - a) * 1000 / (n - 1), 3)
        for name, a, b in zip(("producer", "worker", "redis"), before, after, strict=True)
    }
    return (n - 1) / elapsed, per_task


def _wait_done(client, labels: list[str], timeout_s: float) -> None:
    """Until every label has run. Polls only the labels still pending (one LLEN each),
    newest first, and stops at the first one that has not run: the poll's own CPU,
    on the machine under test, stays small next to the work it measures."""
    pending = list(reversed(labels))
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        while pending and client.llen(f"demo:exec:{pending[0]}"):
            pending.pop(0)
        if pending:
            time.sleep(0.02)
    if pending:
        raise TimeoutError(f"{len(labels) - len(pending)}/{len(labels)} tasks ran in {timeout_s} s")


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--noop", type=int, default=2000, help="no-op tasks per run")
    parser.add_argument("--sleepy", type=int, default=500, help="10 ms tasks per run")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    sizes = {"no-op": args.noop, "10 ms": args.sleepy}
    rates: dict[str, dict[str, list[float]]] = {w: {c: [] for c in CONTENDERS} for w in WORKLOADS}
    cpu: dict[str, dict[str, list[dict[str, float]]]] = {
        w: {c: [] for c in CONTENDERS} for w in WORKLOADS
    }
    with tempfile.TemporaryDirectory(prefix="relier-throughput-") as tmp:
        for _ in range(args.rounds):  # alternate, so machine drift hits every contender
            for workload, sleep_s in WORKLOADS.items():
                for contender in CONTENDERS:
                    rate, per_task = run(contender, sizes[workload], sleep_s, Path(tmp))
                    rates[workload][contender].append(rate)
                    cpu[workload][contender].append(per_task)
                    spent = ", ".join(f"{k} {v:.2f}" for k, v in per_task.items())
                    print(f"{workload:>6} {contender:<10} {rate:8.1f} tasks/s  "
                          f"(CPU ms per task: {spent})", flush=True)  # fmt: skip
    table = {
        workload: {c: round(statistics.median(v), 1) for c, v in per.items()}
        for workload, per in rates.items()
    }  # the median of the rounds
    ratio = table["no-op"]["relier"] / table["no-op"]["acks_late"]
    verdict = "met" if ratio >= 0.8 else "MISSED"
    print("\nmedian tasks/s (1 worker, 2 prefork processes)")
    print(f"{'workload':<8} " + " ".join(f"{c:>10}" for c in CONTENDERS))
    for workload, row in table.items():
        print(f"{workload:<8} " + " ".join(f"{row[c]:>10.1f}" for c in CONTENDERS))
    cpu_table = {
        workload: {
            c: {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}
            for c, runs in per.items()
        }
        for workload, per in cpu.items()
    }
    print("\nmedian CPU ms per task (producer / worker / redis-server)")
    for workload, per in cpu_table.items():
        for c, row in per.items():
            print(f"{workload:<8} {c:<10} " + " / ".join(f"{v:.3f}" for v in row.values()))
    kombu_ratio = table["no-op"]["relier_kombu"] / table["no-op"]["acks_late"]
    print(f"\nno-op relier_django / acks_late: {ratio:.2f} (target >= 0.80: {verdict})")
    print(f"the same on kombu's own transport: {kombu_ratio:.2f}")
    data = {"sizes": sizes, "rounds": args.rounds, "tasks_per_s": table, "all_rounds": rates,
            "cpu_ms_per_task": cpu_table,
            "noop_ratio_vs_acks_late": round(ratio, 3), "target": 0.8,
            "noop_ratio_kombu_transport_vs_acks_late": round(kombu_ratio, 3),
            "target_met": verdict == "met"}  # fmt: skip
    path = write_result("throughput", data)
    print(f"results: {path}")
    return data


if __name__ == "__main__":
    main()
