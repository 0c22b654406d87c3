"""Push overhead: relier ``push()`` against plain Celery ``apply_async()`` of a no-op,
measured in the same run on one private Redis (broker and relier store alike).

Also counts the Redis commands each side sends per push (INFO commandstats), and the
commands per executed task with a real worker running the same no-ops.

    python -m bench.push_overhead [--n 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from bench.common import (
    command_counts,
    diff_counts,
    private_redis,
    setup_django,
    summary_ms,
    write_result,
)

TARGET_NET_P50_MS = 0.5
TARGET_NET_P99_MS = 1.0


def measure(fn, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples


def measure_async(coro_fn, n: int, warmup: int = 20) -> list[float]:
    """``n`` sequential awaits inside one event loop (as an ASGI view would)."""

    from relier_django.core.store.connection import close_loop_clients

    async def body() -> list[float]:
        try:
            for _ in range(warmup):
                await coro_fn()
            samples = []
            for _ in range(n):
                t0 = time.perf_counter()
                await coro_fn()
                samples.append(time.perf_counter() - t0)
            return samples
        finally:
            await close_loop_clients()

    return asyncio.run(body())


def interleaved(sides, n: int, rounds: int = 10) -> list[list[float]]:
    """Alternate blocks of each side, so drift on a shared machine hits all alike."""
    samples: list[list[float]] = [[] for _ in sides]
    for _ in range(rounds):
        for i, side in enumerate(sides):
            samples[i] += side(n // rounds)
    return samples


def per_push_commands(client, fn, n: int) -> dict[str, float]:
    before = command_counts(client)
    for _ in range(n):
        fn()
    return {k: round(v / n, 2) for k, v in diff_counts(command_counts(client), before).items()}


def per_task_commands(server, client, push, n: int) -> dict[str, float]:
    """Commands per executed task, worker included (its idle polling is counted too,
    and the drain check's LLEN/ZCARD; both are a few per run, not per task)."""
    from relier_django.core.model import config
    from relier_django.core.store.keys import KeySpace
    from testproject.harness import CeleryWorker

    expiry = KeySpace(config.current().key_prefix).expiry

    client.flushall()
    with tempfile.TemporaryDirectory() as tmp:
        worker = CeleryWorker(redis_url=server.url, log_dir=Path(tmp), concurrency=2).start()
        try:
            before = command_counts(client)
            for _ in range(n):
                push()
            # Wait until the queue is drained and no task is left in flight (relier's
            # expiry index empties at commit), without polling through receipts, whose
            # GETs would be counted as the task's cost.
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and (client.llen("celery") or client.zcard(expiry)):
                time.sleep(0.05)
            time.sleep(0.5)
            counts = diff_counts(command_counts(client), before)
        finally:
            worker.stop()
    return {k: round(v / n, 2) for k, v in sorted(counts.items())}


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--tasks", type=int, default=300, help="tasks for the per-task count")
    args = parser.parse_args()

    with private_redis() as server:
        setup_django(server.url)
        from testproject.demo.tasks import noop, plain_noop

        client = server.client(decode_responses=True)

        def vanilla():
            plain_noop.apply_async()

        def relier():
            noop.push()

        async def relier_async():
            await noop.apush()

        measure(vanilla, 300)  # warm connections and script cache
        measure(relier, 300)
        client.flushall()
        v, r, a = interleaved(
            [
                lambda n: measure(vanilla, n),
                lambda n: measure(relier, n),
                lambda n: measure_async(relier_async, n),
            ],
            args.n,
        )
        vs, rs, as_ = summary_ms(v), summary_ms(r), summary_ms(a)
        net = {
            "p50_ms": round(rs["p50_ms"] - vs["p50_ms"], 4),
            "p99_ms": round(rs["p99_ms"] - vs["p99_ms"], 4),
        }
        client.flushall()
        cmds = {
            "vanilla_per_push": per_push_commands(client, vanilla, 500),
            "relier_per_push": per_push_commands(client, relier, 500),
        }
        cmds["vanilla_per_task"] = per_task_commands(server, client, vanilla, args.tasks)
        cmds["relier_per_task"] = per_task_commands(server, client, relier, args.tasks)

    result = {
        "benchmark": "push_overhead",
        "vanilla_apply_async": vs,
        "relier_push": rs,
        "relier_apush": as_,
        "net": net,
        "targets": {"net_p50_ms": TARGET_NET_P50_MS, "net_p99_ms": TARGET_NET_P99_MS},
        "met": net["p50_ms"] <= TARGET_NET_P50_MS and net["p99_ms"] <= TARGET_NET_P99_MS,
        "redis_commands": cmds,
    }
    path = write_result("push_overhead", result)
    print(f"push overhead, n={args.n} each, private Redis on loopback")
    print(f"  {'':24} {'p50 ms':>9} {'p99 ms':>9}")
    print(f"  {'celery apply_async':24} {vs['p50_ms']:>9.3f} {vs['p99_ms']:>9.3f}")
    print(f"  {'relier push':24} {rs['p50_ms']:>9.3f} {rs['p99_ms']:>9.3f}")
    print(f"  {'relier apush':24} {as_['p50_ms']:>9.3f} {as_['p99_ms']:>9.3f}")
    print(
        f"  {'net (relier - celery)':24} {net['p50_ms']:>9.3f} {net['p99_ms']:>9.3f}"
        f"   target <= {TARGET_NET_P50_MS} / {TARGET_NET_P99_MS}: "
        + ("met" if result["met"] else "NOT met")
    )
    for name, counts in cmds.items():
        total = round(sum(counts.values()), 2)
        print(f"  redis commands {name:18} {total:>6}  {counts}")
    print(f"  written to {path}")
    return result


if __name__ == "__main__":
    main()
