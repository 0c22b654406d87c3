"""Delivery under kills: vanilla Celery, Celery with acks_late + reject_on_worker_lost,
relier_django and the anchor (PyPI relier 0.1.7, bench/anchor_delivery.py), in the same
run, on the same machine, with the same work.

Each contender gets a fresh private Redis, 2 workers x 2 prefork processes (4 in all),
the same tasks (0.5 s of work each), the same kill schedule (alternating SIGKILL of
one busy pool process and SIGKILL of a whole worker) and a supervisor that restarts
a killed worker at once. Celery's contenders and relier_django run with the same,
short, broker visibility timeout (so acks_late gets its redeliveries within the run);
the anchor with its own defaults. The run goes on past that timeout before
duplicates are counted. relier_django runs with its default heartbeat TTL (10 s) and
scan interval (2 s), as the anchor does with its own.

Counted from Redis, per task: starts (with times and pids) and completed runs; for
relier_django also commits (from the workers' logs), for the anchor the runs its
wrapper let through. Recovery latency: from the kill that took the process running a
task to the task's next start (queueing included), apart by what was killed. For
relier_django also its two phases: detection + re-dispatch (kill -> the resurrector's
``resurrected`` log line, once the broker accepted it) and restart (re-dispatch ->
next start).

The disruption round (``--disrupt``) runs relier_django's workers through a proxy
(chaos/proxy.py) and, between kills, restarts Redis from its append-only file (kill -9,
as chaos's redis-restart does) and cuts the workers' link for 2 s. It counts false
deaths: holders declared dead (``holder found dead``) whose process no kill took, and
second starts that no kill explains. 0 is the target for both.

``--plot PATH`` draws relier_django's phases as histograms (with ``--big``, the full
bench, docs/img/recovery-phases.png).

The RabbitMQ round (``--broker rabbitmq``): Celery + acks_late (+ reject_on_worker_lost)
and relier_django, in the same run, on one private RabbitMQ node
(testproject/rabbitmq.py) as Celery's broker, quorum queues, each contender with
queues of its own; each still gets a fresh private Redis, for relier's store and the
work functions' records. The same work, kills, counting and settling wait as above;
no visibility timeout applies: RabbitMQ gives a dead consumer's unacknowledged
messages back at once, and acks_late's ``reject_on_worker_lost`` requeues a killed
pool process's message at once. Its result is ``delivery-rabbitmq.json`` whatever the
size (the keys carry it).

    python -m bench.delivery [--tasks 500 --kills 5] [--only relier] [--disrupt]
    python -m bench.delivery --big   # the full bench (python -m bench delivery)
    python -m bench.delivery --broker rabbitmq [--tasks 200 --kills 4]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import random
import re
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import NamedTuple

from bench.common import (
    QUEUE_TYPE,
    REPO,
    percentile,
    private_rabbitmq,
    private_redis,
    producer_on,
    rabbitmq_env,
    setup_django,
    write_result,
)
from testproject.rabbitmq import RabbitServer

VISIBILITY_TIMEOUT_S = 20
WORK_S = 0.5
RELIER_TTL_S = 10.0
RELIER_SCAN_S = 2.0
CUT_S = 2.0
PLOT = REPO / "docs" / "img" / "recovery-phases.png"
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
# Not in CONTENDERS (bench/throughput.py runs those): its own venv, workers and push.
ANCHOR = "anchor"
# The RabbitMQ round's: relier_django against Celery's own answer to a killed worker.
RABBITMQ_CONTENDERS = ("acks_late", "relier")
# The full bench's contenders (~22 min in all): vanilla (it loses what a kill takes)
# would add ~7 min and take it to the 30 min the bench may last; --only still runs it.
FULL = ("acks_late", "relier", "anchor")
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


class Interruption(NamedTuple):
    """A run a kill cut short: the task, the kill, the task's next start, and how many
    processes the kill took (1: a pool process; more: a whole worker)."""

    task: int
    killed: float
    restart: float
    took: int


def snapshot(client, labels: list[str]) -> tuple[list[int], list[list[Start]], list[int]]:
    """Per label: completed runs, starts, and commits the anchor's wrapper let through."""
    pipe = client.pipeline()
    for label in labels:
        pipe.llen(f"demo:exec:{label}")
        pipe.lrange(f"demo:start:{label}", 0, -1)
        pipe.llen(f"demo:commit:{label}")
    replies = pipe.execute()
    starts = [
        [(float(s.split(":")[1]), int(s.split(":")[2])) for s in entry] for entry in replies[1::3]
    ]
    return replies[0::3], starts, replies[2::3]


def timeline(span_s: float, kills: int, disrupt: bool) -> list[tuple[float, str]]:
    """When each fault strikes, in seconds after the push: the kills evenly over
    ``span_s``; with ``disrupt`` a Redis restart and a link cut, each halfway between
    two kills (both in the first gap when there are fewer than three kills)."""
    gap = span_s / (kills + 1)
    events = [(gap * (k + 1), "kill") for k in range(kills)]
    if disrupt:
        at = (1.5, 2.5) if kills >= 3 else (4 / 3, 5 / 3)
        events += [(gap * at[0], "redis-restart"), (gap * at[1], "cut")]
    return sorted(events)


def run_contender(
    contender: str, n: int, kills: int, seed: int, log_dir: Path, prefetch: int,
    disrupt: bool = False, broker: RabbitServer | None = None,
) -> dict:  # fmt: skip
    """One contender's round; with ``broker``, Celery's broker is that RabbitMQ node."""
    from chaos.proxy import BlackholeProxy

    task, extra = CONTENDERS.get(contender, ("", {}))
    if broker is not None:
        extra = rabbitmq_env(broker, f"bench-{contender}-{n}x{kills}", extra)
    rng = random.Random(seed)
    labels = [f"{contender}-{i}" for i in range(n)]
    with private_redis() as server:
        client = server.client(decode_responses=True)
        proxy = BlackholeProxy(upstream_port=server.port).start() if disrupt else None
        if disrupt:
            client.config_set("appendfsync", "always")  # as chaos's redis-restart
        url = proxy.url() if proxy else server.url
        env = {**COMMON_ENV, "CELERY_WORKER_PREFETCH_MULTIPLIER": str(prefetch), **extra}
        workers, push, others = _cluster(contender, server.url, url, log_dir, env, task)
        try:
            t0 = time.time()
            ids = push(labels)
            pushed = time.monotonic()
            kill_times: list[Kill] = []
            notes: list[str] = []
            for at, what in timeline(n * WORK_S / 4, kills, disrupt):
                time.sleep(max(0.0, pushed + at - time.monotonic()))
                if what == "kill":
                    kill_times.append(_kill(workers[rng.randrange(2)], len(kill_times), rng))
                else:
                    notes.append(f"at {time.time() - t0:.1f} s: {_disrupt(what, server, proxy)}")
            runs, starts, commits = _settle(client, labels, n)
            elapsed = time.time() - t0
        finally:
            for process in (*workers, *others):
                process.stop()
            if proxy:
                proxy.stop()
        logs = "".join(w.log_path.read_text(errors="replace") for w in workers)
    return summarize(contender, n, kills, runs, starts, commits, kill_times, ids, logs) | {
        "elapsed_s": round(elapsed, 1),
        "disrupted": notes,
    }


def _cluster(contender: str, redis_url: str, url: str, log_dir: Path, env: dict, task: str):
    """Start the contender's 2 workers; returns them, its push and its other processes.
    An AMQP ``CELERY_BROKER_URL`` in ``env`` (``rabbitmq_env``) is the pushes' broker too."""
    from testproject.harness import CeleryWorker

    if contender == ANCHOR:
        from bench import anchor_delivery as anchor

        return anchor.start(redis_url, log_dir, WORK_S)
    setup_django(redis_url)
    _point_at(redis_url)
    workers = [
        CeleryWorker(url, log_dir, name=f"{contender}-w{i}", extra_env=env).start()
        for i in range(2)
    ]
    on_rabbitmq = env.get("CELERY_BROKER_URL", "").startswith("amqp")

    def push(labels: list[str]) -> list[str]:
        with producer_on(env) if on_rabbitmq else contextlib.nullcontext():
            return push_all(contender, task, labels)

    return workers, push, []


def _disrupt(what: str, server, proxy) -> str:
    """Restart Redis as chaos's redis-restart does (SIGKILL, then from its append-only
    file on the same port, fsync always), or cut the workers' link for ``CUT_S``."""
    if what == "redis-restart":
        server.restart(down_s=1.0)
        with server.client() as client:
            client.config_set("appendfsync", "always")
        return "redis-server killed, restarted from its AOF 1 s later"
    proxy.blackhole()
    time.sleep(CUT_S)
    proxy.heal()
    return f"the workers' link to Redis cut for {CUT_S:g} s"


def _kill(victim, k: int, rng: random.Random) -> Kill:
    """The k-th kill: a busy pool process on even k (when there is one), else the whole
    worker, which the supervisor restarts at once."""
    if k % 2 == 0 and victim.children():
        took = frozenset({victim.kill_child(rng.choice(victim.children()).pid)})
        return time.time(), took
    took = frozenset({victim.pid, *(p.pid for p in victim.children())})
    victim.kill()
    killed = time.time()
    victim.start()  # the supervisor
    return killed, took


def _settle(client, labels: list[str], n: int):
    """Wait until every task ran (then past the visibility timeout, for the late
    duplicates) or nothing new happened for longer than any recovery path."""
    settle_s = VISIBILITY_TIMEOUT_S + RELIER_TTL_S + 15
    last, quiet_since = -1, time.monotonic()
    while True:
        done = sum(1 for r in snapshot(client, labels)[0] if r)
        if done != last:
            last, quiet_since = done, time.monotonic()
        if time.monotonic() - quiet_since > settle_s:
            break
        if done == n:
            time.sleep(VISIBILITY_TIMEOUT_S + 5)
            break
        time.sleep(0.5)
    return snapshot(client, labels)


def summarize(
    contender: str, n: int, kills: int, runs: list[int], starts: list[list[Start]],
    commits: list[int], kill_times: list[Kill], ids: list[str], logs: str,
) -> dict:  # fmt: skip
    """Every figure of one contender's run, from what Redis and the logs recorded."""
    cut = interruptions(starts, kill_times)
    phases = recovery_phases(cut, ids, logs)
    pool = [i.restart - i.killed for i in cut if i.took == 1]
    whole = [i.restart - i.killed for i in cut if i.took > 1]
    if contender == "relier":
        twice = list(Counter(re.findall(r"committed task_id=(\w+)", logs)).values())
    elif contender == ANCHOR:
        twice = commits
    else:
        twice = runs
    delivered = sum(1 for r in runs if r)
    return {
        "tasks": n,
        "kills": kills,
        "delivered": delivered,
        "delivered_pct": round(100 * delivered / n, 2),
        "lost": n - delivered,
        "executed_twice": sum(1 for r in runs if r > 1),
        "committed_twice": sum(1 for c in twice if c > 1),
        **spread("recovery", [i.restart - i.killed for i in cut]),
        "recoveries": len(cut),
        **spread("recovery_pool_process_kill", pool),
        **spread("recovery_whole_worker_kill", whole),
        **spread("redispatch", [p.detect for p in phases]),
        # Kept apart as before: a pool process's death is handed off by its worker's
        # main process at once; a whole worker's is found when its connection is gone.
        "redispatch_pool_process_kill_s": sorted(round(p.detect, 3) for p in phases if p.took == 1),
        "redispatch_whole_worker_kill_s": sorted(round(p.detect, 3) for p in phases if p.took > 1),
        **spread("restart", [p.restart for p in phases]),
        "redispatched_again": sum(1 for p in phases if p.sends > 1),
        "unexplained_restarts": unexplained_restarts(starts, kill_times),
        "false_deaths": false_deaths(logs, kill_times),
    }


def spread(name: str, values: list[float]) -> dict[str, object]:
    """``<name>_p50_s``, ``<name>_p99_s`` (None without samples) and the samples."""
    return {
        f"{name}_p50_s": round(percentile(values, 50), 2) if values else None,
        f"{name}_p99_s": round(percentile(values, 99), 2) if values else None,
        f"{name}_latencies_s": [round(v, 3) for v in sorted(values)],
    }


def interruptions(starts: list[list[Start]], kill_times: list[Kill]) -> list[Interruption]:
    """Each run a kill interrupted: the first kill, after the run started, that took the
    process running it; the restart is the task's next start."""
    out = []
    for index, task_starts in enumerate(starts):
        for (previous, pid), (restart, _) in itertools.pairwise(sorted(task_starts)):
            hits = [(at, len(p)) for at, p in kill_times if pid in p and previous <= at <= restart]
            if hits:
                out.append(Interruption(index, hits[0][0], restart, hits[0][1]))
    return out


def unexplained_restarts(starts: list[list[Start]], kill_times: list[Kill]) -> int:
    """Second (and later) starts no kill explains: the run before it was not on a
    process a kill took. A live holder declared dead shows up here."""
    later = sum(max(0, len(task_starts) - 1) for task_starts in starts)
    return later - len(interruptions(starts, kill_times))


_STAMP = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) WARNING relier_django\.resurrector "
_RESURRECTED = re.compile(_STAMP + r"resurrected task_id=(\w+) ", re.MULTILINE)
_FOUND_DEAD = re.compile(
    _STAMP + r"holder found dead \(its connection is gone\) worker=(\S+):(\d+)$", re.MULTILINE
)


def log_time(stamp: str) -> float:
    """The testproject's log time (``%(asctime)s``: local time, milliseconds) as epoch s."""
    return time.mktime(time.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S")) + int(stamp[20:]) / 1000


class Phases(NamedTuple):
    """One relier_django recovery in two phases: kill -> re-dispatched (detection and
    publish, what the TTL + scan bound covers) and re-dispatched -> running again
    (queueing and pickup)."""

    detect: float
    restart: float
    took: int
    sends: int = 1  # re-dispatches before the next start (more: one was lost, sent again)


def recovery_phases(cut: list[Interruption], ids: list[str], logs: str) -> list[Phases]:
    """The phases of each interruption relier_django resurrected (the first
    ``resurrected`` line between the kill and, with 1 s for the log line's own delay,
    the next start)."""
    sent: dict[str, list[float]] = {}
    for stamp, task_id in _RESURRECTED.findall(logs):
        sent.setdefault(task_id, []).append(log_time(stamp))
    out = []
    for i in cut:
        after = [at for at in sent.get(ids[i.task], []) if i.killed <= at <= i.restart + 1]
        if after:
            out.append(Phases(min(after) - i.killed, i.restart - min(after), i.took, len(after)))
    return out


def false_deaths(logs: str, kill_times: list[Kill], slack_s: float = 1.0) -> list[str]:
    """Holders declared dead (``holder found dead``) whose process no kill had taken by
    then (``slack_s`` for the log time's rounding): ``worker:pid`` of each."""
    return [
        f"{worker}:{pid}"
        for stamp, worker, pid in _FOUND_DEAD.findall(logs)
        if not any(int(pid) in took and at <= log_time(stamp) + slack_s for at, took in kill_times)
    ]


def plot_phases(results: dict[str, dict], path: Path) -> str:
    """Histograms of relier_django's recovery phases (every undisrupted relier round
    pooled), one panel per phase; returns what was done."""
    rounds = [k for k in results if k.startswith("relier/")]
    panels = [
        ("kill -> re-dispatched (detection + publish)", "redispatch"),
        ("re-dispatched -> running again (queue + pickup)", "restart"),
        ("kill -> running again", "recovery"),
    ]
    samples = {k: [v for r in rounds for v in results[r][f"{k}_latencies_s"]] for _, k in panels}
    if not samples["redispatch"]:
        return "no relier recoveries to plot"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]'): no plot"
    fig, axes = plt.subplots(1, len(panels), figsize=(13, 3.6), dpi=110)
    for ax, (title, key) in zip(axes, panels, strict=True):
        values = samples[key]
        ax.hist(values, bins=30, color="#4472c4")
        ax.set_title(f"{title}\nn={len(values)}, p50 {percentile(values, 50):.2f} s, "
                     f"p99 {percentile(values, 99):.2f} s", fontsize=9)  # fmt: skip
        ax.set_xlabel("seconds")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_ylabel("recoveries")
    fig.suptitle(f"relier_django recovery phases ({', '.join(rounds)})", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return f"phases plotted to {path}"


def _point_at(url: str) -> None:
    from relier_django import conf
    from testproject.celery import app
    from testproject.harness import reset_celery_connections

    app.conf.broker_url = url
    reset_celery_connections(app)

    conf.get_config.cache_clear()


def _guarded(contender: str, *args) -> dict:
    """``run_contender``; for the anchor, why it could not run if it could not (its
    install, its workers' start), never figures made up."""
    if contender != ANCHOR:
        return run_contender(contender, *args)
    try:
        return run_contender(contender, *args)
    except (OSError, RuntimeError, subprocess.SubprocessError, TimeoutError) as exc:
        from bench.anchor_delivery import HOW

        why = f"{type(exc).__name__}: {str(exc).strip()[-600:]}"
        return {"not_run": f"{why} (tried: {HOW})"}


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument(
        "--big", action="store_true",
        help=f"the full bench: {', '.join(FULL)} at --tasks x --kills and 2,000 x 10, then "
        "the disruption round for relier at --tasks x --kills; plots to --plot",
    )  # fmt: skip
    parser.add_argument(
        "--disrupt", action="store_true",
        help="relier's runs also restart Redis and cut the workers' link once",
    )  # fmt: skip
    parser.add_argument("--plot", type=Path, help=f"phases histogram (--big: {PLOT})")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--prefetch-multiplier", type=int, default=4,
        help="Celery's worker_prefetch_multiplier, the same for every contender but the "
        "anchor, which sets its own (1) (default 4)",
    )  # fmt: skip
    parser.add_argument("--only", nargs="*", choices=[*CONTENDERS, ANCHOR], help="run only these")
    parser.add_argument(
        "--broker", choices=("redis", "rabbitmq"), default="redis",
        help=f"rabbitmq: the RabbitMQ round, {' and '.join(RABBITMQ_CONTENDERS)} on one private "
        f"node ({QUEUE_TYPE} queues) at --tasks x --kills, written to delivery-rabbitmq.json",
    )  # fmt: skip
    parser.add_argument(
        "--keep-logs", type=Path, metavar="DIR",
        help="write the workers' logs under DIR (one directory per round) and keep them",
    )  # fmt: skip
    args = parser.parse_args()
    rabbit = args.broker == "rabbitmq"
    if rabbit and (args.big or args.disrupt or ANCHOR in (args.only or ())):
        parser.error("--broker rabbitmq runs Celery's contenders and relier at one size: "
                     "no --big, --disrupt (its faults are Redis's) or anchor")  # fmt: skip
    chosen = args.only or (RABBITMQ_CONTENDERS if rabbit else FULL if args.big else
                           [*CONTENDERS, ANCHOR])  # fmt: skip
    plan = [(c, args.tasks, args.kills, args.disrupt and c == "relier") for c in chosen]
    if args.big:
        plan += [(c, 2000, 10, False) for c in chosen]
        plan += [("relier", args.tasks, args.kills, True)] if "relier" in chosen else []
        plan = list(dict.fromkeys(plan))  # --big --disrupt: that round once
    results: dict[str, dict] = {}
    with contextlib.ExitStack() as stack:
        node = stack.enter_context(private_rabbitmq()) if rabbit else None
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="relier-delivery-"))
        for contender, n, kills, disrupt in plan:
            key = f"{contender}{'+disrupt' if disrupt else ''}/{n}x{kills}"
            logs = (args.keep_logs or Path(tmp)) / key.replace("/", "-")
            print(f"running {key}{' on RabbitMQ' if rabbit else ''} … (logs: {logs})", flush=True)
            results[key] = _guarded(
                contender, n, kills, args.seed, logs, args.prefetch_multiplier, disrupt, node
            )
        version = node.ctl("version").strip() if node else None
    plot = args.plot or (PLOT if args.big else None)
    out = {
        "benchmark": "delivery",
        "broker": f"rabbitmq {version}, {QUEUE_TYPE} queues" if rabbit else "redis",
        "work_s": WORK_S,
        "visibility_timeout_s": None if rabbit else VISIBILITY_TIMEOUT_S,  # kombu's Redis only
        "relier_ttl_s": RELIER_TTL_S,
        "relier_scan_s": RELIER_SCAN_S,
        "prefetch_multiplier": args.prefetch_multiplier,
        "target_recovery_p99_s": RELIER_TTL_S + RELIER_SCAN_S + 1,
        "results": results,
        "plot": plot_phases(results, plot) if plot else None,
    }
    name = "delivery" + ("" if args.big and not args.only else f"-{args.tasks}x{args.kills}")
    name = "delivery-rabbitmq" if rabbit else name  # the RabbitMQ round's result, any size
    name += f"-prefetch{args.prefetch_multiplier}" if args.prefetch_multiplier != 4 else ""
    name += f"-{'-'.join(args.only)}" if args.only else ""
    name += "-disrupt" if args.disrupt else ""
    print_tables(out, write_result(name, out))
    return out


def _row(cells: tuple) -> str:
    return f"  {cells[0]!s:<22}" + "".join(f"  {v!s:>12}" for v in cells[1:])


def print_tables(out: dict, path: Path) -> None:
    results = {k: r for k, r in out["results"].items() if "not_run" not in r}
    broker = ("on RabbitMQ" if out.get("broker", "redis") != "redis" else
              f"visibility timeout {VISIBILITY_TIMEOUT_S} s")  # fmt: skip
    print(f"\ndelivery under kills (0.5 s tasks, 4 processes, {broker}, relier TTL "
          f"{RELIER_TTL_S:g} s, scan {RELIER_SCAN_S:g} s; the anchor with its "
          "defaults)")  # fmt: skip
    print(_row(("run", "delivered %", "lost", "exec 2x", "commit 2x", "rec p50 s", "rec p99 s",
                "sent p50 s", "sent p99 s")))  # fmt: skip
    for key, r in results.items():
        print(_row((key, r["delivered_pct"], r["lost"], r["executed_twice"], r["committed_twice"],
                    r["recovery_p50_s"], r["recovery_p99_s"], r["redispatch_p50_s"],
                    r["redispatch_p99_s"])))  # fmt: skip
    if any(key.startswith(f"{ANCHOR}/") for key in results):
        from bench.anchor_delivery import HOW, NAME

        print(f"  {ANCHOR}: {NAME}, with its defaults ({HOW})")
    print("\nkill -> running again, by what was killed; second starts no kill explains")
    print(_row(("run", "pool n", "pool p50 s", "pool p99 s", "worker n", "worker p50 s",
                "worker p99 s", "unexplained")))  # fmt: skip
    for key, r in results.items():
        pool, whole = "recovery_pool_process_kill", "recovery_whole_worker_kill"
        print(_row((key, len(r[f"{pool}_latencies_s"]), r[f"{pool}_p50_s"], r[f"{pool}_p99_s"],
                    len(r[f"{whole}_latencies_s"]), r[f"{whole}_p50_s"], r[f"{whole}_p99_s"],
                    r["unexplained_restarts"])))  # fmt: skip
    print("\nrelier_django's recovery phases: kill -> re-dispatched -> running again")
    print(_row(("run", "n", "sent p50 s", "sent p99 s", "restart p50", "restart p99",
                "sent again", "false deaths")))  # fmt: skip
    for key, r in results.items():
        if key.startswith("relier"):
            print(_row((key, len(r["restart_latencies_s"]), r["redispatch_p50_s"],
                        r["redispatch_p99_s"], r["restart_p50_s"], r["restart_p99_s"],
                        r["redispatched_again"], len(r["false_deaths"]))))  # fmt: skip
            for note in r["disrupted"]:
                print(f"    {key}: {note}")
    for key, r in out["results"].items():
        if "not_run" in r:
            print(f"\n{key}: NOT RUN, no figures: {r['not_run']}")
    print(f"\ntarget for relier: 100.0 % delivered, 0 committed twice, 0 false deaths, "
          f"recovery p99 <= {out['target_recovery_p99_s']:g} s (rec: kill -> running again; "
          f"sent: kill -> re-dispatched); {out['plot'] or 'no plot (--plot PATH)'}; "
          f"written to {path}")  # fmt: skip


if __name__ == "__main__":
    main()
