"""Admission check latency: relier_django's admit.lua against the anchor, same run.

The anchor is the PyPI package ``relier`` 0.1.7 (its ``admission_control.
check_capacity()``), installed into its own venv (``.run/anchor-venv``) because its
dependencies are not ours. Each side runs in its own process against the same private
Redis on loopback, with --callers concurrent coroutines on one event loop, each timing
its own calls; the sides alternate for --rounds rounds so machine drift hits both.
Limits are set high enough that every check is admitted (the common path).

Target (issue 6): relier_django's p99 <= 0.7 x the anchor's.

    python -m bench.admission [--calls 4000] [--callers 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from bench.common import REPO, percentile, private_redis, write_result

ANCHOR_VENV = REPO / ".run" / "anchor-venv"
ANCHOR = "relier==0.1.7"

# Both probes print one JSON list of per-call latencies in seconds.
OURS = """
import asyncio, json, sys, time
import redis.asyncio
from relier_django.core import admission
from relier_django.core.keys import KeySpace
from relier_django.core.rates import Rate

url, calls, callers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
keys = KeySpace("rl")
found = (admission.Limit(keys.admission_all, Rate(10**9, 60)),)

async def main():
    client = redis.asyncio.Redis.from_url(url, decode_responses=True)
    check = admission.check(found)
    await check.arun(client)  # load the script, open connections
    samples = []
    async def caller(n):
        for _ in range(n):
            t0 = time.perf_counter()
            assert (await check.arun(client)).admitted
            samples.append(time.perf_counter() - t0)
    await asyncio.gather(*(caller(calls // callers) for _ in range(callers)))
    await client.aclose()
    print(json.dumps(samples))

asyncio.run(main())
"""

# What a relier_django push actually pays for admission: push.lua with and without
# one admission counter, interleaved, same callers. The check rides in the push's own
# round trip, so its cost is the difference.
PUSH_PROBE = """
import asyncio, json, sys, time, uuid
import redis.asyncio
from relier_django.core import admission, idempotency
from relier_django.core.envelope import Envelope
from relier_django.core.keys import KeySpace
from relier_django.core.rates import Rate

url, calls, callers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
keys = KeySpace("rl")
gate = (admission.Limit(keys.admission_all, Rate(10**9, 60)),)

async def main():
    client = redis.asyncio.Redis.from_url(url, decode_responses=True)
    samples = {"off": [], "on": []}
    async def caller(n):
        for i in range(n):
            mode = "on" if i % 2 else "off"
            env = Envelope(id=uuid.uuid4().hex, task="bench.t", args=(i,), kwargs={}, queue="")
            call = idempotency.store(keys, env, env.encode(), 60_000, 3,
                                     gate if mode == "on" else ())
            t0 = time.perf_counter()
            assert (await call.arun(client)).stored
            samples[mode].append(time.perf_counter() - t0)
    await caller(20)
    samples = {"off": [], "on": []}
    await asyncio.gather(*(caller(calls // callers) for _ in range(callers)))
    await client.aclose()
    print(json.dumps(samples))

asyncio.run(main())
"""

ANCHOR_PROBE = """
import asyncio, json, sys, time
from relier.core.admission import admission_control

calls, callers = int(sys.argv[2]), int(sys.argv[3])

async def main():
    await admission_control.check_capacity("bench")  # load the script, open connections
    samples = []
    async def caller(n):
        for _ in range(n):
            t0 = time.perf_counter()
            admitted, _ = await admission_control.check_capacity("bench")
            assert admitted
            samples.append(time.perf_counter() - t0)
    await asyncio.gather(*(caller(calls // callers) for _ in range(callers)))
    print(json.dumps(samples))

asyncio.run(main())
"""


def ensure_anchor() -> Path:
    python = ANCHOR_VENV / "bin" / "python"
    if not python.exists():
        print(f"installing the anchor ({ANCHOR}) into {ANCHOR_VENV} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(ANCHOR_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", ANCHOR], check=True)
    return python


def probe(python: Path, code: str, url: str, calls: int, callers: int, env: dict) -> list[float]:
    done = subprocess.run(
        [str(python), "-c", code, url, str(calls), str(callers)],
        cwd=REPO, env=env, capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--callers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    anchor_python = ensure_anchor()
    with private_redis() as server:
        ours_env = {**os.environ, "PYTHONPATH": str(REPO)}
        anchor_env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("RELIER_")},
            "RELIER_REDIS_URL": server.url,
            "RELIER_ADMISSION_LIMIT": str(10**9),
            "RELIER_ADMISSION_WINDOW": "60",
        }
        samples: dict[str, list[float]] = {"relier_django": [], "anchor relier 0.1.7": []}
        for _ in range(args.rounds):
            samples["relier_django"] += probe(
                Path(sys.executable), OURS, server.url, args.calls, args.callers, ours_env
            )
            samples["anchor relier 0.1.7"] += probe(
                anchor_python, ANCHOR_PROBE, server.url, args.calls, args.callers, anchor_env
            )
        pushes = json.loads(
            subprocess.run(
                [sys.executable, "-c", PUSH_PROBE, server.url, str(args.calls), str(args.callers)],
                cwd=REPO, env=ours_env, capture_output=True, text=True, check=True, timeout=600,
            ).stdout.strip().splitlines()[-1]
        )  # fmt: skip
    table = {}
    print(f"\n{args.callers} concurrent callers, {args.rounds} x {args.calls} checks each side")
    print(f"{'system':<22} {'p50 ms':>8} {'p99 ms':>8}")
    for name, values in samples.items():
        ms = [v * 1000 for v in values]
        table[name] = {
            "n": len(ms),
            "p50_ms": round(percentile(ms, 50), 4),
            "p99_ms": round(percentile(ms, 99), 4),
        }
        print(f"{name:<22} {table[name]['p50_ms']:>8.3f} {table[name]['p99_ms']:>8.3f}")
    marginal = {}
    for mode, label in (("off", "push.lua, no admission"), ("on", "push.lua + admission")):
        ms = [v * 1000 for v in pushes[mode]]
        marginal[label] = {"n": len(ms), "p50_ms": round(percentile(ms, 50), 4),
                           "p99_ms": round(percentile(ms, 99), 4)}  # fmt: skip
        print(f"{label:<22} {marginal[label]['p50_ms']:>8.3f} {marginal[label]['p99_ms']:>8.3f}")
    ratio = table["relier_django"]["p99_ms"] / table["anchor relier 0.1.7"]["p99_ms"]
    verdict = "met" if ratio <= 0.7 else "MISSED"
    print(f"\nstandalone check, p99 ratio relier_django / anchor: {ratio:.2f} "
          f"(target <= 0.70: {verdict})")  # fmt: skip
    path = write_result(
        "admission",
        {"callers": args.callers, "rounds": args.rounds, "calls": args.calls,
         "systems": table, "p99_ratio": round(ratio, 3), "target": 0.7,
         "push_with_and_without_admission": marginal},
    )  # fmt: skip
    print(f"results: {path}")


if __name__ == "__main__":
    main()
