"""relier_django against Celery with acks_late, every figure of issue 37 in one run.

Each contender runs as shipped and as a user comparing them would run it: one worker
with 2 prefork processes on a fresh private Redis (broker and store), Celery on kombu's
own Redis transport with ``acks_late``, relier_django on its own transport with every
guarantee and its metrics on. Printed, each figure with its target and met / MISSED:

- throughput, no-op and 10 ms tasks (first push to last run, ``bench/throughput.py``'s
  run), in rounds that alternate the contenders;
- over the same spans, CPU per task of redis-server, of the worker (main and pool
  processes) and of the producer;
- requests per task (every command a client sent, ``MONITOR``) and round trips per
  task (a ``MULTI``...``EXEC`` block counted once, as kombu pipelines it);
- ``push()`` latency, p50 and p99, on a store no other process has stamped with its
  layout and on one a worker stamped, against ``apply_async()`` with a Redis result
  backend and without one, interleaved;
- Redis memory per queued task (10,000 pushed, no worker);
- the fleet simulator's table and an idle worker's memory, when ``bench/fleet.py`` and
  ``bench/worker_memory.py`` have written their results (``make bench`` runs them).

    python -m bench.parity [--noop 2000] [--sleepy 500] [--rounds 2] [--pushes 3000]

Other sizes than the defaults write ``parity-small.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import RESULTS, private_redis, setup_django, summary_ms, write_result

# Celery with acks_late in the same Django project without relier_django installed
# (bench/throughput.py's acks_late_alone), and relier_django as shipped.
CELERY = "acks_late_alone"
CONTENDERS = (CELERY, "relier")
DEFAULTS = {"noop": 2000, "sleepy": 500, "rounds": 2, "pushes": 3000, "queued": 10_000}
TARGETS = {
    "noop_throughput": 1.0,  # relier / acks_late, at least
    "redis_cpu": 1.3,  # relier / acks_late per task, at most
    "worker_cpu": 1.1,
    "push_p50": 0.95,  # relier push / apply_async with a result backend, at most
    "queued_bytes": 1.5,
    "idle_worker_pss": 1.2,
}


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


# -- throughput and CPU -------------------------------------------------------------


def throughput(sizes: dict[str, int], rounds: int, log_dir: Path) -> dict[str, Any]:
    """Tasks per second and CPU ms per task (producer, worker, redis), medians of the
    rounds, for each workload and contender."""
    from bench.throughput import WORKLOADS, run

    rates: dict[str, dict[str, list[float]]] = {w: {c: [] for c in CONTENDERS} for w in WORKLOADS}
    cpu: dict[str, dict[str, list[dict[str, float]]]] = {
        w: {c: [] for c in CONTENDERS} for w in WORKLOADS
    }
    for round_ in range(rounds):
        order = CONTENDERS if round_ % 2 == 0 else tuple(reversed(CONTENDERS))
        for workload, sleep_s in WORKLOADS.items():
            for contender in order:
                rate, per_task, _ = run(contender, sizes[workload], sleep_s, log_dir)
                rates[workload][contender].append(rate)
                cpu[workload][contender].append(per_task)
                print(f"round {round_ + 1} {workload:>6} {contender:<10} {rate:8.1f} tasks/s "
                      f"(CPU ms per task: {per_task})", flush=True)  # fmt: skip
    return {
        "tasks_per_s": {w: {c: round(statistics.median(v), 1) for c, v in per.items()}
                        for w, per in rates.items()},
        "all_rounds": rates,
        "cpu_ms_per_task": {
            w: {c: {k: round(statistics.median(r[k] for r in runs), 4) for k in runs[0]}
                for c, runs in per.items()}
            for w, per in cpu.items()
        },
    }  # fmt: skip


# -- requests and round trips -------------------------------------------------------


def round_trips(capture: Path) -> tuple[int, int]:
    """From a MONITOR capture: (requests, round trips) clients sent; a MULTI...EXEC
    block from one client is one round trip (kombu sends it as one pipeline)."""
    from bench.store_cost import HARNESS

    requests = trips = 0
    open_blocks: set[str] = set()
    for line in capture.read_text(errors="replace").splitlines():
        _, _, rest = line.partition(" [")
        source, _, words = rest.partition("] ")
        if not words or source.endswith(" lua"):
            continue
        name = words.split(" ", 1)[0].strip('"').upper()
        if name in HARNESS or name == "MONITOR":
            continue
        requests += 1
        client = source.split(" ", 1)[-1]
        if name == "MULTI":
            open_blocks.add(client)
            trips += 1
        elif name == "EXEC":
            open_blocks.discard(client)
        elif client not in open_blocks:
            trips += 1
    return requests, trips


def commands(tasks: int, log_dir: Path) -> dict[str, Any]:
    """Requests and round trips per task, and the commands scripts ran, per contender."""
    from bench.store_cost import run

    found: dict[str, Any] = {}
    for contender in CONTENDERS:
        detail = run(contender, tasks, log_dir, "monitor")
        requests, trips = round_trips(log_dir / f"monitor-{contender}.txt")
        per = tasks - 1
        found[contender] = {
            "requests_per_task": round(requests / per, 2),
            "round_trips_per_task": round(trips / per, 2),
            "in_scripts_per_task": round(sum(detail["in_scripts"].values()), 2),
            "sent": detail["sent"],
        }
    return found


def _noop() -> None:
    """Celery's side of a no-op push (never run here)."""


def _work(label: str, sleep_s: float) -> None:
    """Celery's side of a queued task (never run here)."""


# -- push latency -------------------------------------------------------------------


def _timed(fn: Callable[[], object], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples


def push_latency(pushes: int) -> dict[str, Any]:
    """push() on an unstamped and on a stamped store, apply_async() with a Redis result
    backend and without, interleaved in ten blocks on one private Redis."""
    import celery

    from bench.delivery import _point_at

    with private_redis() as server:
        setup_django(server.url)
        _point_at(server.url)
        from relier_django import conf
        from relier_django.core.store import layout
        from relier_django.core.store.keys import KeySpace
        from testproject.demo.tasks import noop

        layout_keys = KeySpace.of(conf.get_config())

        client = server.client(decode_responses=True)
        backed = celery.Celery("parity", broker=server.url, backend=server.url)
        plain = celery.Celery("parity_plain", broker=server.url)
        for app in (backed, plain):
            app.conf.update(task_serializer="json", accept_content=["json"],
                            broker_transport="redis")  # fmt: skip
        backed_noop = backed.task(name="parity.noop")(_noop)
        plain_noop = plain.task(name="parity.noop", ignore_result=True)(_noop)

        def fresh_store() -> None:
            # A store no worker has stamped, and a process that has not pushed to it:
            # its first push records the layout, the others ask nothing.
            layout._matched.clear()
            client.delete("rl:layout")

        sides: dict[str, Callable[[], object]] = {
            "relier push, store no worker stamped": noop.push,
            "relier push, store a worker stamped": noop.push,
            "apply_async, result backend": backed_noop.apply_async,
            "apply_async, no result backend": plain_noop.apply_async,
        }
        for fn in sides.values():  # warm connections and the script cache
            _timed(fn, 200)
        samples: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(10):
            for name, fn in sides.items():
                if name == "relier push, store no worker stamped":
                    fresh_store()
                elif name == "relier push, store a worker stamped":
                    layout.mismatch(client, layout_keys)  # as a worker does at start
                samples[name] += _timed(fn, pushes // 10)
            client.flushdb()
    return {name: summary_ms(s) for name, s in samples.items()}


# -- memory per queued task ---------------------------------------------------------


def queued_bytes(n: int) -> dict[str, float]:
    """Redis used_memory per task, ``n`` pushed with no worker: relier's push() (its
    stored task, its message and the expiry index) and Celery's apply_async() on kombu's
    transport (its message)."""
    import celery

    found: dict[str, float] = {}
    from bench.delivery import _point_at

    with private_redis() as server:
        setup_django(server.url)
        _point_at(server.url)
        from testproject.demo.tasks import work

        client = server.client()
        app = celery.Celery("parity_mem", broker=server.url)
        app.conf.update(task_serializer="json", accept_content=["json"], broker_transport="redis")
        plain = app.task(name="parity.work", ignore_result=True)(_work)
        pushes = {
            "relier": lambda i: work.push(f"label-{i:07d}", 0.0),
            CELERY: lambda i: plain.apply_async((f"label-{i:07d}", 0.0)),
        }
        for contender, push in pushes.items():
            push(-1)  # connections, scripts and layout record first
            client.flushdb()
            before = client.info("memory")["used_memory"]
            for i in range(n):
                push(i)
            found[contender] = round((client.info("memory")["used_memory"] - before) / n, 1)
            client.flushdb()
    return found


# -- report -------------------------------------------------------------------------


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def report(data: dict[str, Any]) -> None:
    t, cpu = data["throughput"]["tasks_per_s"], data["throughput"]["cpu_ms_per_task"]
    print("\nrelier_django against Celery acks_late (1 worker x 2 prefork processes, "
          "private Redis each)")  # fmt: skip
    print(f"{'per executed task':<34} {'relier':>10} {'acks_late':>10} {'ratio':>7}  target")
    rows: list[tuple[str, float, float, str, bool | None]] = []
    for workload in t:
        ratio = t[workload]["relier"] / t[workload][CELERY]
        ok = ratio >= TARGETS["noop_throughput"] if workload == "no-op" else None
        rows.append((f"throughput {workload}, tasks/s", t[workload]["relier"],
                     t[workload][CELERY], f">= {TARGETS['noop_throughput']}", ok))  # fmt: skip
    for key, label, target in (("redis", "Redis CPU, us", "redis_cpu"),
                               ("worker", "worker CPU (main + pool), us", "worker_cpu"),
                               ("producer", "producer CPU, us", None)):  # fmt: skip
        r, c = cpu["no-op"]["relier"][key] * 1000, cpu["no-op"][CELERY][key] * 1000
        ok = r / c <= TARGETS[target] if target else None
        rows.append((label, r, c, f"<= {TARGETS[target]}" if target else "", ok))
    cmd = data["commands"]
    for key, label in (("requests_per_task", "requests sent"),
                       ("round_trips_per_task", "round trips"),
                       ("in_scripts_per_task", "commands run in scripts")):  # fmt: skip
        rows.append((label, cmd["relier"][key], cmd[CELERY][key], "", None))
    q = data["queued_bytes"]
    rows.append(("Redis bytes per queued task", q["relier"], q[CELERY],
                 f"<= {TARGETS['queued_bytes']}",
                 q["relier"] / q[CELERY] <= TARGETS["queued_bytes"]))  # fmt: skip
    for label, r, c, target, ok in rows:
        ratio = f"{r / c:6.2f}x" if c >= 0.1 else "      -"
        verdict = "" if ok is None else _verdict(ok)
        print(f"{label:<34} {r:>10.2f} {c:>10.2f} {ratio}  {target} {verdict}")
    p = data["push_latency"]
    backed = p["apply_async, result backend"]
    print(f"\n{'push latency, ms':<34} {'p50':>8} {'p99':>8}  p50 vs apply_async + backend")
    for name, s in p.items():
        ratio = s["p50_ms"] / backed["p50_ms"]
        verdict = ""
        if name.startswith("relier"):
            verdict = f"(target <= {TARGETS['push_p50']}: {_verdict(ratio <= TARGETS['push_p50'])})"
        print(f"{name:<34} {s['p50_ms']:>8.3f} {s['p99_ms']:>8.3f}  {ratio:5.2f}x {verdict}")
    fleet = _load("fleet")
    if fleet and "table" in fleet:
        print("\nfleet simulator (bench/fleet.py, its own run):")
        for line in fleet["table"]:
            print(f"  {line}")
    memory = _load("worker_memory")
    if memory and "median_mib" in memory:
        pss = {c: m["total"]["pss"] for c, m in memory["median_mib"].items()}
        ratio = pss["relier"] / pss["acks_late"]
        print(f"\nidle worker PSS (bench/worker_memory.py, {memory['machine']['at']}): relier "
              f"{pss['relier']} MiB, Celery acks_late {pss['acks_late']} MiB, {ratio:.2f}x "
              f"(target <= {TARGETS['idle_worker_pss']}: "
              f"{_verdict(ratio <= TARGETS['idle_worker_pss'])})")  # fmt: skip


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, value in DEFAULTS.items():
        parser.add_argument(f"--{name}", type=int, default=value)
    args = parser.parse_args()
    chosen = {name: getattr(args, name) for name in DEFAULTS}
    with tempfile.TemporaryDirectory(prefix="relier-parity-") as tmp:
        data: dict[str, Any] = {"sizes": chosen}
        data["throughput"] = throughput(
            {"no-op": args.noop, "10 ms": args.sleepy}, args.rounds, Path(tmp)
        )
        data["commands"] = commands(min(args.noop, 1000), Path(tmp))
    data["push_latency"] = push_latency(args.pushes)
    data["queued_bytes"] = queued_bytes(args.queued)
    data["targets"] = TARGETS
    report(data)
    path = write_result("parity" if chosen == DEFAULTS else "parity-small", data)
    print(f"\nresults: {path}")
    return data


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
