"""The cost of a chain step over a plain push (docs/workflows.md), in the same run, on
one private Redis with one real worker (prefork, concurrency 2):

- Redis commands per executed task, worker included: N plain pushes of a no-op, then
  the same N no-ops as chains of 5 immutable steps. The target: no extra round trip
  (a step is created inside the commit script the task runs anyway).
- Time per step of one long chain (each step starts when the one before commits),
  against the same steps pushed by hand one after the other (push, wait for the
  result, push the next: what code without chains does).

    python -m bench.workflows [--n 500] [--length 20]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.common import command_counts, diff_counts, private_redis, setup_django, write_result

CHAIN = 5


def _drained(client, expiry: str, queue: str = "celery", timeout_s: float = 180) -> None:
    # Without polling receipts, whose reads would be counted as the tasks' cost.
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and (client.llen(queue) or client.zcard(expiry)):
        time.sleep(0.05)
    time.sleep(0.5)


def per_task(client, expiry: str, start, n: int) -> dict[str, float]:
    before = command_counts(client)
    start()
    _drained(client, expiry)
    counts = diff_counts(command_counts(client), before)
    return {k: round(v / n, 2) for k, v in sorted(counts.items())}


def scripts(counts: dict[str, float]) -> float:
    return round(counts.get("evalsha", 0) + counts.get("eval", 0), 2)


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=500, help="tasks per side for the counts")
    parser.add_argument("--length", type=int, default=20, help="steps of the timed chain")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    n = args.n - args.n % CHAIN

    with private_redis() as server:
        setup_django(server.url)
        from celery import chain

        import relier_django
        from relier_django.core.model import config
        from relier_django.core.store.keys import KeySpace
        from testproject.demo.tasks import noop
        from testproject.harness import CeleryWorker

        client = server.client(decode_responses=True)
        expiry = KeySpace(config.current().key_prefix).expiry
        with tempfile.TemporaryDirectory() as tmp:
            worker = CeleryWorker(redis_url=server.url, log_dir=Path(tmp), concurrency=2).start()
            try:
                # Warm the worker, the script cache and the connections.
                chain(*(noop.si() for _ in range(CHAIN))).apply_async()
                for _ in range(20):
                    noop.push()
                _drained(client, expiry)

                def plain() -> None:
                    for _ in range(n):
                        noop.push()

                def chained() -> None:
                    for _ in range(n // CHAIN):
                        chain(*(noop.si() for _ in range(CHAIN))).apply_async()

                plain_counts = per_task(client, expiry, plain, n)
                chain_counts = per_task(client, expiry, chained, n)

                by_chain, by_hand = [], []
                for _ in range(args.rounds):
                    t0 = time.perf_counter()
                    last = chain(*(noop.si() for _ in range(args.length))).apply_async()
                    relier_django.result(last.id).get(timeout=120)
                    by_chain.append((time.perf_counter() - t0) / args.length)
                    t0 = time.perf_counter()
                    for _ in range(args.length):
                        noop.push().get(timeout=120)
                    by_hand.append((time.perf_counter() - t0) / args.length)
            finally:
                worker.stop()

    step_ms = sorted(s * 1000 for s in by_chain)[len(by_chain) // 2]
    hand_ms = sorted(s * 1000 for s in by_hand)[len(by_hand) // 2]
    result = {
        "benchmark": "workflows",
        "tasks": n,
        "chain_length_for_counts": CHAIN,
        "redis_commands_per_task": {"plain_push": plain_counts, "chain_step": chain_counts},
        "script_calls_per_task": {
            "plain_push": scripts(plain_counts),
            "chain_step": scripts(chain_counts),
        },
        "step_latency_ms_median": {"chain": round(step_ms, 2), "push_wait_push": round(hand_ms, 2)},
        "target": "a chain step makes no more script calls than a plain push and run",
        "met": scripts(chain_counts) <= scripts(plain_counts),
    }
    path = write_result("workflows", result)
    print(f"workflows: {n} no-op tasks per side, one worker (prefork, concurrency 2)")
    for side, counts in result["redis_commands_per_task"].items():
        total = round(sum(counts.values()), 2)
        print(f"  {side:12} {total:>6} commands/task, {scripts(counts):>5} script calls: {counts}")
    print(
        f"  per step of a {args.length}-step chain: {step_ms:.2f} ms (median of {args.rounds}); "
        f"push, wait, push by hand: {hand_ms:.2f} ms"
    )
    print(f"  no extra round trip: {'met' if result['met'] else 'NOT met'}")
    print(f"  written to {path}")
    return result


if __name__ == "__main__":
    main()
