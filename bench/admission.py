"""Admission check latency: relier_django's admit.lua against the anchor, same run.

The anchor is the PyPI package ``relier`` 0.1.7 (its ``admission_control.
check_capacity()``), installed into its own venv (``.run/anchor-venv``) because its
dependencies are not ours. Each side runs in its own process against the same private
Redis on loopback, with --callers concurrent coroutines on one event loop, each timing
its own calls; the systems alternate for --rounds rounds so machine drift hits all.
Limits are set high enough that every check is admitted (the common path). Ours is
``admission.acheck`` (the event loop's pipelined connection); the same script through
a pooled redis-py client is shown beside it.

Target (issue 6): relier_django's p99 <= 0.7 x the anchor's under concurrent callers
(judged at every count above 1). With a single caller each check is one loopback round
trip on both sides, the floor the issue names; its ratio is printed, not judged.

    python -m bench.admission [--calls 4000] [--callers 1,8] [--rounds 3]
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
from relier_django.core.push import admission
from relier_django.core.store import pipelined
from relier_django.core.model.config import Config
from relier_django.core.store.keys import KeySpace
from relier_django.core.model.rates import Rate

url, calls, callers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cfg = Config(redis_url=url)
found = (admission.Limit(KeySpace("rl").admission_all, Rate(10**9, 60)),)

async def main():
    await admission.acheck(found, cfg)  # load the script, open the connection
    samples = []
    async def caller(n):
        for _ in range(n):
            t0 = time.perf_counter()
            assert (await admission.acheck(found, cfg)).admitted
            samples.append(time.perf_counter() - t0)
    await asyncio.gather(*(caller(calls // callers) for _ in range(callers)))
    pipelined.close_loop()
    print(json.dumps(samples))

asyncio.run(main())
"""

# The same script through a pooled redis-py asyncio client (what check().arun does),
# to show what the pipelined connection buys.
OURS_REDISPY = """
import asyncio, json, sys, time
import redis.asyncio
from relier_django.core.push import admission
from relier_django.core.store.keys import KeySpace
from relier_django.core.model.rates import Rate

url, calls, callers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
found = (admission.Limit(KeySpace("rl").admission_all, Rate(10**9, 60)),)

async def main():
    client = redis.asyncio.Redis.from_url(url, decode_responses=True)
    check = admission.check(found)
    await check.arun(client)
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

OURS_NAME = "relier_django acheck (pipelined)"
REDISPY_NAME = "relier_django check, redis-py pool"
ANCHOR_NAME = "anchor relier 0.1.7"

# What a relier_django push actually pays for admission: push.lua with and without
# one admission counter, interleaved, same callers. The check rides in the push's own
# round trip, so its cost is the difference.
PUSH_PROBE = """
import asyncio, json, sys, time, uuid
import redis.asyncio
from relier_django.core.push import admission, idempotency
from relier_django.core.model.envelope import Envelope
from relier_django.core.store.keys import KeySpace
from relier_django.core.model.rates import Rate

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


def _summary(values: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values]
    return {"n": len(ms), "p50_ms": round(percentile(ms, 50), 4),
            "p99_ms": round(percentile(ms, 99), 4)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--callers", default="1,8", help="comma-separated caller counts")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    caller_counts = [int(c) for c in args.callers.split(",")]
    anchor_python = ensure_anchor()
    systems = {
        OURS_NAME: (Path(sys.executable), OURS),
        REDISPY_NAME: (Path(sys.executable), OURS_REDISPY),
        ANCHOR_NAME: (anchor_python, ANCHOR_PROBE),
    }
    by_callers: dict[str, dict] = {}
    with private_redis() as server:
        ours_env = {**os.environ, "PYTHONPATH": str(REPO)}
        anchor_env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("RELIER_")},
            "RELIER_REDIS_URL": server.url,
            "RELIER_ADMISSION_LIMIT": str(10**9),
            "RELIER_ADMISSION_WINDOW": "60",
        }
        for callers in caller_counts:
            samples: dict[str, list[float]] = {name: [] for name in systems}
            for _ in range(args.rounds):  # alternate, so machine drift hits every system
                for name, (python, code) in systems.items():
                    env = anchor_env if name == ANCHOR_NAME else ours_env
                    samples[name] += probe(python, code, server.url, args.calls, callers, env)
            table = {name: _summary(values) for name, values in samples.items()}
            ratio = table[OURS_NAME]["p99_ms"] / table[ANCHOR_NAME]["p99_ms"]
            by_callers[str(callers)] = {"systems": table, "p99_ratio": round(ratio, 3)}
        pushes = json.loads(
            subprocess.run(
                [sys.executable, "-c", PUSH_PROBE, server.url, str(args.calls), "8"],
                cwd=REPO, env=ours_env, capture_output=True, text=True, check=True, timeout=600,
            ).stdout.strip().splitlines()[-1]
        )  # fmt: skip
    met: bool | None = None  # not judged unless some count above 1 was measured
    for callers, result in by_callers.items():
        print(f"\n{callers} concurrent caller(s), {args.rounds} x {args.calls} checks per system")
        print(f"{'system':<34} {'p50 ms':>8} {'p99 ms':>8}")
        for name, row in result["systems"].items():
            print(f"{name:<34} {row['p50_ms']:>8.3f} {row['p99_ms']:>8.3f}")
        if int(callers) == 1:
            print(f"p99 ratio {OURS_NAME} / anchor: {result['p99_ratio']:.2f} "
                  "(one round trip each: the floor, not judged)")  # fmt: skip
            continue
        verdict = "met" if result["p99_ratio"] <= 0.7 else "MISSED"
        met = (met is not False) and verdict == "met"
        print(f"p99 ratio {OURS_NAME} / anchor: {result['p99_ratio']:.2f} "
              f"(target <= 0.70: {verdict})")  # fmt: skip
    marginal = {
        "push.lua, no admission": _summary(pushes["off"]),
        "push.lua + admission": _summary(pushes["on"]),
    }
    print("\nwhat admission adds to a push (8 callers, interleaved):")
    for label, row in marginal.items():
        print(f"{label:<34} {row['p50_ms']:>8.3f} {row['p99_ms']:>8.3f}")
    path = write_result(
        "admission",
        {"rounds": args.rounds, "calls": args.calls, "by_callers": by_callers,
         "target_p99_ratio": 0.7, "target_met": met,
         "push_with_and_without_admission": marginal},
    )  # fmt: skip
    print(f"results: {path}")


if __name__ == "__main__":
    main()
