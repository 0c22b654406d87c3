"""The store on a Redis Cluster: the Redis CPU each master spends per task as the
store's partitions spread over 1 and then 3 masters, beside the plain layout.

Three layouts of relier's store, in the same run, with the same work:

- ``plain``: one plain Redis, unpartitioned (``RELIER_PARTITIONS=1``): the anchor.
- ``cluster-1``: a Redis Cluster of 1 master serving every slot, ``RELIER_CLUSTER=true``
  and ``RELIER_PARTITIONS=6``: every partition on that one master.
- ``cluster-3``: a Redis Cluster of 3 masters (as ``redis-cli --cluster create`` splits
  the slots), ``RELIER_PARTITIONS=6``: two partitions on each master.

No replicas: a replica's CPU is not a master's. Celery's broker is a plain private
Redis of its own in every layout (kombu's transport does not run on a cluster), so the
store's nodes carry only the store. Each run starts fresh servers and one worker with
2 prefork processes, pushes a warm-up (every partition, so every master has loaded
the scripts and every process holds its connections), then, timed, ``--tasks``
no-op relier tasks (``demo.noop``) from one producer (this process); it waits until
relier's metrics have counted them all committed (one HGET per partition every
50 ms: its share is in the command counts, and is well under 1 % of them).

Over that span, from each master's ``INFO`` (its own getrusage, to the microsecond):
its CPU (user + system) and the commands it ran (``commandstats``: the ``EVALSHA``
calls clients sent, and every command, those scripts ran included), and the read
events it processed (``total_reads_processed``: one per batch of requests a client's
write delivered, so fewer commands per read means more system calls per command).
Before the span, each master's CPU over 2 s with the worker up and no task (its
background: cron, the cluster bus, the worker's scanner) is read apart. Reported per
task: the store's total Redis CPU (summed over masters), each master's CPU and share
of the total, and two ratios: the busiest master's CPU per task at 3 masters over
the single master's at 1 (1/3 if the load spreads evenly), and the total at 3 masters
over the total at 1 (1 if partitioning over more masters costs nothing more), with
the masters' wakeups per task, 3 over 1, beside it: a master woken for fewer requests
at a time pays its event loop's fixed cost per pass (epoll, the AOF write, the reply
flush) over fewer of them: the extra CPU of spreading follows the wakeups, where the
commands per task stay the same. The
plain layout's figure says what the cluster layout itself costs. The worker's
background work (heartbeats, the scanner visiting every partition, liveness) is in
the figures, as it is in production; the keys tied to no task (``{g}``: scanner
lease, worker presence) sit on one master, which then carries a little more.

A machine with 2 cores cannot show a cluster's total throughput grow with its
masters: producer, worker and every master share those cores. What this measures is
the per-master share of the work: what sets how many tasks per second one master
carries, and so how far throughput can grow with masters on machines with the cores.
The tasks per second printed are for the record only.

Rounds run the layouts in an order that flips every round, so the machine's drift
falls on every layout alike; the figures are medians over rounds.

    python -m bench.cluster_cost [--tasks 2000] [--rounds 4] [--partitions 6]

Other sizes than the defaults write ``cluster_cost-small.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import command_counts, diff_counts, private_redis, setup_django, write_result
from bench.store_cost import _server_cpu_s
from testproject.harness import RedisServer

# layout -> masters (None: a plain Redis, unpartitioned)
LAYOUTS: dict[str, int | None] = {"plain": None, "cluster-1": 1, "cluster-3": 3}
DEFAULTS = {"tasks": 2000, "rounds": 4, "partitions": 6}
WARM_PER_PARTITION = 8
POLL_S = 0.05
IDLE_S = 2.0
# Commands the benchmark itself sends to a master around the timed span.
HARNESS = {"info"}


@contextlib.contextmanager
def _store(layout: str, partitions: int) -> Iterator[tuple[list[RedisServer], dict[str, Any]]]:
    """The layout's store: its masters (by first slot), the ``RELIER_*`` settings that
    point relier at it, and per master the partitions it serves."""
    from redis.crc import key_slot

    from relier_django.core.store.keys import partition_tags
    from testproject.cluster import ClusterGroup

    masters = LAYOUTS[layout]
    if masters is None:
        with private_redis() as server:
            env = {"RELIER_REDIS_URL": server.url, "RELIER_PARTITIONS": "1"}
            yield [server], {"env": env, "partitions": {server.port: [0]}}
        return
    with tempfile.TemporaryDirectory(prefix="relier-bench-cluster-") as tmp:
        group = ClusterGroup(Path(tmp), masters=masters, replicas=0)
        try:
            group.start()
            nodes = group.masters()
            owned: dict[int, list[int | str]] = {node.port: [] for node in nodes}
            for k, tag in enumerate(partition_tags(partitions)):
                owned[group.master_of_slot(key_slot(tag.encode())).port].append(k)
            owned[group.master_of_slot(key_slot(b"g")).port].append("g")  # the {g} keys
            env = {
                "RELIER_REDIS_URL": group.url,
                "RELIER_CLUSTER": "true",
                "RELIER_PARTITIONS": str(partitions),
            }
            yield nodes, {"env": env, "partitions": owned}
        finally:
            group.stop()


def _committed(client: Any, parts: list[Any]) -> int:
    """Tasks committed so far, summed over every partition's metrics counters."""
    pipe = client.pipeline(transaction=False)
    for part in parts:
        pipe.hget(part.metrics_counters, "committed")
    return sum(int(v or 0) for v in pipe.execute())


def _wait_committed(client: Any, parts: list[Any], target: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while (done := _committed(client, parts)) < target:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{done}/{target} tasks committed in {timeout_s} s")
        time.sleep(POLL_S)


def _switches(pid: int) -> dict[str, int]:
    """The context switches of ``pid``'s main thread, the one that runs commands:
    voluntary ones (``wakeups``: it slept in epoll_wait until a request came, so one
    per pass of its event loop that found it idle) and forced ones (``preempted``: the
    machine's cores were wanted elsewhere)."""
    found = {}
    for line in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == "voluntary_ctxt_switches":
            found["wakeups"] = int(value)
        elif name == "nonvoluntary_ctxt_switches":
            found["preempted"] = int(value)
    return found


EVENTS = ("reads", "writes", "wakeups", "preempted")


def _reading(node: RedisServer) -> tuple[float, dict[str, int]]:
    """The node's CPU seconds so far, and its calls by command, with among them the
    read and write events it has processed (``reads``: one per batch of requests a
    client's write delivered; ``writes``: one per reply flushed) and its main thread's
    context switches (``_switches``)."""
    with node.client(decode_responses=True) as client:
        stats = client.info("stats")
        events = {
            "reads": int(stats["total_reads_processed"]),
            "writes": int(stats["total_writes_processed"]),
            **_switches(node.pid),
        }
        return _server_cpu_s(client), {**command_counts(client), **events}


def run(layout: str, n: int, partitions: int, log_dir: Path) -> dict[str, Any]:
    """One run of ``n`` no-op tasks on ``layout``: per master its CPU and commands per
    task, the store's total, the broker's CPU per task and the tasks per second."""
    from relier_django.core.model.config import current
    from relier_django.core.store.connection import sync_client
    from relier_django.core.store.keys import KeySpace
    from testproject.demo.tasks import noop
    from testproject.harness import CeleryWorker, process_pointed_at, worker_env

    with (
        private_redis() as broker,
        _store(layout, partitions) as (nodes, store),
        process_pointed_at(worker_env(broker.url, store["env"])),
    ):
        worker = CeleryWorker(broker.url, log_dir, name=f"cc-{layout}", extra_env=store["env"])
        worker.start()
        try:
            config = current()
            client = sync_client(config)
            parts = KeySpace.of(config).parts()
            warm = WARM_PER_PARTITION * len(parts)
            for _ in range(warm):
                noop.push()
            _wait_committed(client, parts, warm, 60)
            idle = [_reading(node)[0] for node in nodes]
            time.sleep(IDLE_S)  # the worker up, no task: the masters' background
            before = [_reading(node) for node in nodes]
            broker_before = _reading(broker)[0]
            t0 = time.perf_counter()
            for _ in range(n):
                noop.push()
            _wait_committed(client, parts, warm + n, 600)
            elapsed = time.perf_counter() - t0
            after = [_reading(node) for node in nodes]
            broker_after = _reading(broker)[0]
        finally:
            worker.stop()
    per_node = []
    for node, quiet, (cpu0, calls0), (cpu1, calls1) in zip(nodes, idle, before, after, strict=True):
        ran = {k: v for k, v in diff_counts(calls1, calls0).items() if k not in HARNESS}
        events = {k: ran.pop(k, 0) for k in EVENTS}
        per_node.append({
            "port": node.port,
            "partitions": store["partitions"][node.port],
            "cpu_us_per_task": round((cpu1 - cpu0) * 1e6 / n, 1),
            "evalsha_per_task": round(ran.get("evalsha", 0) / n, 3),
            "commands_per_task": round(sum(ran.values()) / n, 2),
            "reads_per_task": round(events["reads"] / n, 2),
            "writes_per_task": round(events["writes"] / n, 2),
            "wakeups_per_task": round(events["wakeups"] / n, 2),
            "preempted_per_task": round(events["preempted"] / n, 3),
            "idle_cpu_ms_per_s": round((cpu0 - quiet) * 1000 / IDLE_S, 2),
        })  # fmt: skip
    total = sum(m["cpu_us_per_task"] for m in per_node)
    for m in per_node:
        m["share"] = round(m["cpu_us_per_task"] / total, 4) if total else 0.0
    return {
        "masters": per_node,
        "total_cpu_us_per_task": round(total, 1),
        "broker_cpu_us_per_task": round((broker_after - broker_before) * 1e6 / n, 1),
        "tasks_per_s": round(n / elapsed, 1),
    }


# Each master's figures per run, of which the summary keeps the medians over rounds.
MASTER_FIGURES = ("cpu_us_per_task", "share", "evalsha_per_task", "commands_per_task",
                  "reads_per_task", "writes_per_task", "wakeups_per_task",
                  "preempted_per_task", "idle_cpu_ms_per_s")  # fmt: skip


def _median(values: list[float], digits: int = 1) -> float:
    return round(statistics.median(values), digits)


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians over rounds: per layout its total and each master's figures (masters by
    first slot); then the ratios, from those medians and round by round."""
    layouts: dict[str, Any] = {}
    for layout, found in runs.items():
        masters = []
        for i, first in enumerate(found[0]["masters"]):
            each = [r["masters"][i] for r in found]
            figures = {key: _median([m[key] for m in each], 1 if key == "cpu_us_per_task" else 3)
                       for key in MASTER_FIGURES}  # fmt: skip
            masters.append({"partitions": first["partitions"], **figures})
        layouts[layout] = {
            "masters": masters,
            **{key: _median([r[key] for r in found])
               for key in ("total_cpu_us_per_task", "broker_cpu_us_per_task", "tasks_per_s")},
        }  # fmt: skip
    out: dict[str, Any] = {"layouts": layouts}
    one, three, plain = (layouts.get(k) for k in ("cluster-1", "cluster-3", "plain"))
    if one and three:
        alone = one["masters"][0]["cpu_us_per_task"]
        busiest = max(m["cpu_us_per_task"] for m in three["masters"])
        out["per_master_3_over_1"] = {
            "busiest": round(busiest / alone, 3),
            "mean": round(three["total_cpu_us_per_task"] / len(three["masters"]) / alone, 3),
            "even_spread": round(1 / len(three["masters"]), 3),
        }
        out["total_3_over_1"] = round(
            three["total_cpu_us_per_task"] / one["total_cpu_us_per_task"], 3
        )
        out["wakeups_3_over_1"] = round(
            sum(m["wakeups_per_task"] for m in three["masters"])
            / one["masters"][0]["wakeups_per_task"],
            3,
        )
        out["per_round_total_3_over_1"] = [
            round(b["total_cpu_us_per_task"] / a["total_cpu_us_per_task"], 3)
            for a, b in zip(runs["cluster-1"], runs["cluster-3"], strict=True)
        ]
        out["per_round_busiest_3_over_1"] = [
            round(max(m["cpu_us_per_task"] for m in b["masters"])
                  / a["masters"][0]["cpu_us_per_task"], 3)
            for a, b in zip(runs["cluster-1"], runs["cluster-3"], strict=True)
        ]  # fmt: skip
    if plain:
        out["total_over_plain"] = {
            layout: round(layouts[layout]["total_cpu_us_per_task"]
                          / plain["total_cpu_us_per_task"], 3)
            for layout in layouts if layout != "plain"
        }  # fmt: skip
    return out


def _owned(partitions: list[int | str]) -> str:
    return ",".join(str(p) for p in partitions)


# Each master's figures the table shows after its CPU and share, to two decimals.
TABLED = ("evalsha_per_task", "commands_per_task", "reads_per_task", "wakeups_per_task",
          "idle_cpu_ms_per_s")  # fmt: skip


def table(summary: dict[str, Any], n: int, rounds: int) -> list[str]:
    """The printed table (and REPORT.md's): one row per master of every layout."""
    lines = [
        f"{n:,} no-op tasks per run, medians over {rounds} round(s); Redis CPU in µs per task",
        "",
        "| layout | master | partitions | CPU µs/task | share | EVALSHA/task | "
        "commands/task | reads/task | wakeups/task | idle CPU ms/s | store total µs/task | "
        "tasks/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for layout, d in summary["layouts"].items():
        for i, m in enumerate(d["masters"]):
            first = i == 0
            cells = (
                layout if first else "",
                i + 1,
                _owned(m["partitions"]),
                m["cpu_us_per_task"],
                f"{m['share']:.0%}",
                *(f"{m[key]:.2f}" for key in TABLED),
                d["total_cpu_us_per_task"] if first else "",
                d["tasks_per_s"] if first else "",
            )
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines.append("")
    if "per_master_3_over_1" in summary:
        r = summary["per_master_3_over_1"]
        lines.append(
            f"- Per-master CPU per task, 3 masters / 1 master: busiest {r['busiest']}, mean "
            f"{r['mean']} (an even spread: {r['even_spread']}); rounds (busiest): "
            f"{summary['per_round_busiest_3_over_1']}."
        )
        lines.append(
            f"- Total CPU per task, 3 masters / 1 master: {summary['total_3_over_1']} "
            f"(1: no cost to spreading); rounds: {summary['per_round_total_3_over_1']}. "
            f"Wakeups per task, all masters, 3 / 1: {summary['wakeups_3_over_1']}."
        )
    if "total_over_plain" in summary:
        over = ", ".join(f"{k} {v} x" for k, v in summary["total_over_plain"].items())
        lines.append(f"- Total CPU per task over the plain, unpartitioned store: {over}.")
    return lines


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=DEFAULTS["tasks"])
    parser.add_argument("--rounds", type=int, default=DEFAULTS["rounds"])
    parser.add_argument("--partitions", type=int, default=DEFAULTS["partitions"])
    args = parser.parse_args()
    setup_django("redis://127.0.0.1:1/0")  # every run points relier and Celery anew
    chosen = list(LAYOUTS)
    runs: dict[str, list[dict[str, Any]]] = {layout: [] for layout in chosen}
    with tempfile.TemporaryDirectory(prefix="relier-cluster-cost-") as tmp:
        for round_ in range(args.rounds):
            for layout in chosen if round_ % 2 == 0 else reversed(chosen):
                found = run(layout, args.tasks, args.partitions, Path(tmp))
                runs[layout].append(found)
                each = " ".join(f"{m['cpu_us_per_task']:.0f}" for m in found["masters"])
                print(f"round {round_ + 1} {layout:<10} store CPU "
                      f"{found['total_cpu_us_per_task']:5.0f} us per task (per master: {each}), "
                      f"{found['tasks_per_s']:.0f} tasks/s", flush=True)  # fmt: skip
    summary = summarize(runs)
    print()
    print("\n".join(table(summary, args.tasks, args.rounds)))
    print("\nThis machine has 2 cores: it cannot show total throughput grow with masters; "
          "the claim is the per-master share.")  # fmt: skip
    sized = all(getattr(args, k) == v for k, v in DEFAULTS.items())
    path = write_result(
        "cluster_cost" if sized else "cluster_cost-small",
        {"tasks": args.tasks, "rounds": args.rounds, "partitions": args.partitions,
         "worker_concurrency": 2, "warm_up_tasks_per_partition": WARM_PER_PARTITION,
         **summary, "runs": runs},
    )  # fmt: skip
    print(f"\nwritten: {path}")
    return summary


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    main()
