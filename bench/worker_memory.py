"""An idle worker's memory: Celery with acks_late, relier_django, and the anchor.

Each contender gets a fresh private Redis and one worker of 1 main + 2 prefork
processes (``testproject.harness.CeleryWorker``, as ``bench/throughput.py`` starts
them), in the same Django project: a Django user runs Celery with Django loaded too.
Its settings are the testproject's (``bench/memory_settings.py``), with the test
suite's task modules replaced by one task doing the same work on every side
(``bench/memory_tasks.py``; ``memory_plain_tasks.py`` for Celery). Celery's worker
runs without relier_django installed: the testproject's ``@rl_task`` modules would
otherwise bring relier's hooks, threads and connections into it, as they do in the
other benchmarks' Celery contenders (checked: none of relier's connections opens).

- ``acks_late``: Celery with ``task_acks_late`` and ``task_reject_on_worker_lost``,
  on kombu's own Redis transport, with a Redis result backend (the private Redis),
  each task pushed with ``ignore_result=False`` so its result is stored.
- ``relier``: relier_django as shipped and as its docs tell users to run it: its
  transport, metrics on, the embedded resurrector.
- ``anchor``: the PyPI package ``relier`` 0.1.7, as ``bench/anchor_delivery.py`` runs
  it (its own venv, its own Celery app: no Django), one worker.

Once the worker is ready, a few tasks run (each pool process runs at least one, so
both are warm), then the worker is left alone for ``--idle`` seconds and each of its
processes is read: PSS (``psutil``'s ``memory_full_info().pss``: a page shared by n
processes counts 1/n in each, so the sum over the worker is what the worker costs the
machine), USS (the pages only that process holds) and RSS, and its thread count.
The contenders alternate, the order flipping every round, and the figures are the
medians over rounds.

Target (issue 37): relier_django's idle PSS (main + 2 pool processes) <= 1.2 x Celery
acks_late's.

    python -m bench.worker_memory [--rounds 3] [--idle 5] [--only acks_late relier]
        [--concurrency 2]

Another concurrency than 2, fewer rounds or fewer contenders write
``worker_memory-small-c<concurrency>.json``, leaving the recorded result alone.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from bench.common import private_redis, setup_django, write_result
from bench.delivery import KOMBU_TRANSPORT, _point_at

TARGET = 1.2  # relier's total PSS / acks_late's
MiB = 1024 * 1024
ACKS_LATE = {
    **KOMBU_TRANSPORT,
    "CELERY_TASK_ACKS_LATE": "true",
    "CELERY_TASK_REJECT_ON_WORKER_LOST": "true",
}
CONTENDERS = ("acks_late", "relier", "anchor")
WARM_TASKS_PER_PROCESS = 3  # each long enough that every pool process takes some
WARM_SLEEP_S = 0.2
FIELDS = ("pss", "uss", "rss")


def read_process(pid: int) -> dict[str, float]:
    """PSS, USS and RSS of one process in MiB, and its threads."""
    process = psutil.Process(pid)
    full = process.memory_full_info()
    found = {name: round(getattr(full, name) / MiB, 2) for name in FIELDS}
    return {**found, "threads": process.num_threads()}


def read_worker(main_pid: int, children: list[int]) -> dict[str, Any]:
    """The main process's figures, each pool process's, and the sums."""
    main = read_process(main_pid)
    pool = [read_process(pid) for pid in sorted(children)]
    total = {name: round(main[name] + sum(p[name] for p in pool), 2) for name in FIELDS}
    return {"main": main, "pool": pool, "total": total}


def _started_by(client, labels: list[str]) -> set[int]:
    """The pids of the pool processes that ran ``labels`` (``demo:start`` entries end
    in ``:<pid>``, for every contender's task)."""
    pids = set()
    for label in labels:
        for entry in client.lrange(f"demo:start:{label}", 0, -1):
            pids.add(int(entry.rsplit(":", 1)[1]))
    return pids


def _warm(client, push: Callable[[list[str]], Any], pool: set[int], tag: str) -> None:
    """Run tasks until every pool process has run one (at most 5 batches)."""
    ran: set[int] = set()
    for batch in range(5):
        labels = [f"mem-{tag}-{batch}-{i}" for i in range(WARM_TASKS_PER_PROCESS * len(pool))]
        push(labels)
        deadline = time.monotonic() + 60
        while any(not client.llen(f"demo:exec:{label}") for label in labels):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{tag}: warm-up tasks did not run in 60 s")
            time.sleep(0.05)
        ran |= _started_by(client, labels)
        if pool <= ran:
            return
    raise RuntimeError(f"{tag}: pool processes {sorted(pool - ran)} ran no task")


@contextlib.contextmanager
def _worker(
    contender: str, url: str, log_dir: Path, concurrency: int
) -> Iterator[tuple[Any, Callable]]:
    """The contender's worker on ``url``, and how to push its tasks (labels -> ...)."""
    if contender == "anchor":
        from bench import anchor_delivery
        from bench.admission import ensure_anchor

        python = ensure_anchor()
        code = anchor_delivery.write_code(log_dir / "anchor-code")
        worker = anchor_delivery.AnchorWorker(
            url, log_dir, name="mem-anchor", concurrency=concurrency, python=python, code_dir=code
        )

        def push(labels: list[str]) -> Any:
            return anchor_delivery.push_all(python, url, code, labels, WARM_SLEEP_S)

    else:
        from bench.memory_tasks import work
        from testproject.celery import app
        from testproject.harness import CeleryWorker

        _point_at(url)
        env = {"DJANGO_SETTINGS_MODULE": "bench.memory_settings"}
        if contender == "acks_late":
            env |= {**ACKS_LATE, "CELERY_RESULT_BACKEND": url, "BENCH_MEMORY_RELIER": "0"}
        worker = CeleryWorker(
            url, log_dir, name=f"mem-{contender}", concurrency=concurrency, extra_env=env
        )

        def push(labels: list[str]) -> Any:
            if contender == "relier":
                return [work.push(label, WARM_SLEEP_S) for label in labels]
            return [
                app.send_task("bench.plain_work", args=[label, WARM_SLEEP_S], ignore_result=False)
                for label in labels
            ]

    worker.start()
    try:
        yield worker, push
    finally:
        worker.stop()


def _check_celery_alone(client) -> None:
    """Celery's worker stored its results and ran none of relier_django: no connection
    of its names (``rl|<worker>`` liveness, ``relier:<pid>`` clients) ever opened."""
    if not client.keys("celery-task-meta-*"):
        raise RuntimeError("acks_late: no result was stored in the result backend")
    names = [c["name"] for c in client.client_list() if c["name"]]
    if names:
        raise RuntimeError(f"acks_late: relier_django ran in Celery's worker: {names}")


def run(contender: str, idle_s: float, log_dir: Path, concurrency: int = 2) -> dict[str, Any]:
    """One idle worker of ``contender`` on a private Redis, read after ``idle_s``."""
    with private_redis() as server:
        setup_django(server.url)
        client = server.client(decode_responses=True)
        with _worker(contender, server.url, log_dir, concurrency) as (worker, push):
            pool = {p.pid for p in worker.children()}
            if len(pool) != concurrency:
                raise RuntimeError(f"{contender}: {len(pool)} pool processes, not {concurrency}")
            _warm(client, push, pool, contender)
            if contender == "acks_late":
                _check_celery_alone(client)
            time.sleep(idle_s)
            children = [p.pid for p in worker.children()]
            if set(children) != pool:
                raise RuntimeError(f"{contender}: pool processes changed while idle")
            return read_worker(worker.pid, children)


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over runs: main, per pool process (both pooled), total."""

    def med(values: list[float]) -> float:
        return round(statistics.median(values), 2)

    return {
        "main": {f: med([r["main"][f] for r in runs]) for f in (*FIELDS, "threads")},
        "per_pool_process": {
            f: med([p[f] for r in runs for p in r["pool"]]) for f in (*FIELDS, "threads")
        },
        "total": {f: med([r["total"][f] for r in runs]) for f in FIELDS},
    }


def table(medians: dict[str, dict[str, Any]], rounds: int) -> list[str]:
    """The markdown table of the medians, MiB."""
    lines = [
        f"| median of {rounds} (MiB) | PSS main | PSS per pool process | **PSS total** | "
        "USS total | RSS total | threads main / pool |",
        "|---|---|---|---|---|---|---|",
    ]
    for contender, m in medians.items():
        cells = (
            contender, m["main"]["pss"], m["per_pool_process"]["pss"], f"**{m['total']['pss']}**",
            m["total"]["uss"], m["total"]["rss"],
            f"{m['main']['threads']:g} / {m['per_pool_process']['threads']:g}",
        )  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", type=float, default=5.0, help="seconds idle before reading")
    parser.add_argument("--only", nargs="*", choices=CONTENDERS, help="run only these")
    parser.add_argument(
        "--concurrency", type=int, default=2, help="pool processes (other than 2: not recorded)"
    )
    args = parser.parse_args()
    chosen = list(args.only or CONTENDERS)
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in chosen}
    with tempfile.TemporaryDirectory(prefix="relier-memory-") as tmp:
        for n in range(args.rounds):  # the order flips every round: drift hits all alike
            for contender in chosen if n % 2 == 0 else chosen[::-1]:
                found = run(contender, args.idle, Path(tmp) / f"{contender}-{n}", args.concurrency)
                runs[contender].append(found)
                pool = " + ".join(f"{p['pss']:.1f}" for p in found["pool"])
                print(f"round {n + 1} {contender:<10} PSS main {found['main']['pss']:.1f} + "
                      f"pool {pool} = {found['total']['pss']:.1f} MiB "
                      f"(USS {found['total']['uss']:.1f}, RSS {found['total']['rss']:.1f})",
                      flush=True)  # fmt: skip
    medians = {c: _median(r) for c, r in runs.items()}
    print(f"\nidle worker, 1 main + {args.concurrency} prefork processes, "
          f"{args.idle:g} s idle after warm-up")  # fmt: skip
    print("\n".join(table(medians, args.rounds)))
    ratio = met = None
    if "relier" in medians and "acks_late" in medians:
        ratio = round(medians["relier"]["total"]["pss"] / medians["acks_late"]["total"]["pss"], 3)
        met = ratio <= TARGET
        print(f"\nrelier_django / Celery acks_late, PSS total: {ratio:.2f} "
              f"(target <= {TARGET}: {'met' if met else 'MISSED'})")  # fmt: skip
    data = {"rounds": args.rounds, "idle_s": args.idle, "concurrency": args.concurrency,
            "median_mib": medians, "runs": runs, "pss_ratio_vs_acks_late": ratio, "target": TARGET,
            "target_met": met}  # fmt: skip
    default = args.only is None and args.rounds >= 3 and args.concurrency == 2
    name = "worker_memory" if default else f"worker_memory-small-c{args.concurrency}"
    print(f"results: {write_result(name, data)}")
    return data


if __name__ == "__main__":
    main()
