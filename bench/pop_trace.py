"""A pop that leaves a trace (issue 35): whole-worker SIGKILLs, before and after
``take.lua``, in the same run.

"Before" is relier_django at the commit before take.lua came (the parent of the first
commit that added ``relier_django/core/store/lua/take.lua``, checked out into a
temporary git worktree); "after" is this checkout. Both run the same workers of the
testproject (``demo.work``), each round on a fresh private Redis (broker and store),
with relier's defaults but a 0.5 s scan interval (the death checks run every 0.25 s
whatever it is). The producer is this process, on this checkout's code.

- **idle**: one worker (2 prefork processes) on the task's queue, idle; SIGKILL of its
  whole process group, a push within a millisecond, and the worker started again at
  once (a supervisor); a standby worker on another queue leads the scanners and
  consumes the recovery queue. ``--kills`` times.
- **busy**: two workers on the task's queue, pushes at ``--rate`` per second (no-op
  tasks) while every ``--every`` seconds one worker (in turn) is SIGKILLed whole and
  started again at once; ``--kills`` kills.
- **throughput**: no kills; ``--noop`` no-op tasks drained by one worker x 2, first
  push to last run: tasks per second, redis-server CPU and commands per task.

A task *waited* when its first start came more than ``LATE_S`` (10 s) after its push,
or never (a stranded message waits ``QUEUED_GRACE_S``, an hour). The target: none.

    python -m bench.pop_trace [--kills 50] [--rate 200] [--every 2] [--noop 2000]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from bench.common import REPO, command_counts, diff_counts, private_redis, setup_django
from bench.common import write_result as write
from bench.delivery import _point_at, snapshot
from bench.throughput import _cpu_s, _wait_done

LATE_S = 10.0
SETTLE_S = 40.0  # past one TTL, a death check and a restart: anything later waited
QUEUE = "celery"  # Celery's default queue, where the producer's pushes go
STANDBY_QUEUE = "bench.standby"
ENV = {"RELIER_SCAN_INTERVAL_S": "0.5", "CELERY_WORKER_PREFETCH_MULTIPLIER": "4"}
TAKE = "relier_django/core/store/lua/take.lua"


@contextlib.contextmanager
def before_checkout(added_file: str = TAKE) -> Iterator[Path]:
    """This repository at the parent of the commit that added ``added_file`` (take.lua),
    in a temporary worktree, removed on exit."""
    added = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%H", "--", added_file],
        cwd=REPO, check=True, capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    if not added:
        raise RuntimeError(f"{added_file} is not committed yet: no 'before' to compare with")
    with tempfile.TemporaryDirectory(prefix="relier-before-") as tmp:
        path = Path(tmp) / "checkout"
        git = ["git", "-C", str(REPO)]
        subprocess.run([*git, "worktree", "add", "--detach", str(path), f"{added[-1]}~1"],
                       check=True, capture_output=True)  # fmt: skip
        try:
            yield path
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(path)],
                           check=False, capture_output=True)  # fmt: skip


def _worker(url: str, log_dir: Path, name: str, code: Path | None, queues: tuple[str, ...]):  # type: ignore[no-untyped-def]
    from testproject.harness import CeleryWorker

    env = dict(ENV)
    if code is not None:
        env["PYTHONPATH"] = str(code)
    return CeleryWorker(url, log_dir, name=name, queues=queues, extra_env=env, cwd=code)


def _push(labels: list[str], sleep_s: float = 0.0) -> None:
    from testproject.demo.tasks import work

    for label in labels:
        work.push(label, sleep_s)


def _waits(client, pushed: dict[str, float]) -> list[float | None]:  # type: ignore[no-untyped-def]
    """Each task's wait from its push to its first start (None: never started)."""
    labels = list(pushed)
    _runs, starts, _commits = snapshot(client, labels)
    return [
        (min(t for t, _pid in s) - pushed[label]) if s else None
        for label, s in zip(labels, starts, strict=True)
    ]


def _verdict(waits: list[float | None], kills: int) -> dict:
    late = [w for w in waits if w is None or w > LATE_S]
    started = sorted(w for w in waits if w is not None)
    return {
        "tasks": len(waits),
        "kills": kills,
        "waited_over_10s": len(late),
        "never_started": sum(1 for w in waits if w is None),
        "per_kill": round(len(late) / kills, 3) if kills else 0.0,
        "wait_p50_s": round(statistics.median(started), 3) if started else None,
        "wait_max_s": round(started[-1], 3) if started else None,
    }


def idle_round(code: Path | None, kills: int, log_dir: Path) -> dict:
    """SIGKILL an idle worker and push within a millisecond, ``kills`` times."""
    with private_redis() as server:
        setup_django(server.url)
        _point_at(server.url)
        client = server.client(decode_responses=True)
        standby = _worker(server.url, log_dir, "idle-standby", code, (STANDBY_QUEUE,)).start()
        worker = _worker(server.url, log_dir, "idle-w", code, (QUEUE,)).start()
        pushed: dict[str, float] = {}
        try:
            for k in range(kills):
                time.sleep(0.4)  # idle: the worker waits for work
                assert worker.process is not None
                os.killpg(worker.process.pid, signal.SIGKILL)
                label = f"idle-{k}"
                pushed[label] = time.time()
                _push([label])
                worker.kill()  # reaps it
                worker.start()  # the supervisor
            _settle(client, pushed)
            waits = _waits(client, pushed)
        finally:
            worker.stop()
            standby.stop()
    return _verdict(waits, kills)


def busy_round(code: Path | None, kills: int, rate: float, every_s: float, log_dir: Path) -> dict:
    """Pushes at ``rate`` a second while a worker is SIGKILLed every ``every_s``."""
    with private_redis() as server:
        setup_django(server.url)
        _point_at(server.url)
        client = server.client(decode_responses=True)
        workers = [_worker(server.url, log_dir, f"busy-w{i}", code, (QUEUE,)).start()
                   for i in range(2)]  # fmt: skip
        pushed: dict[str, float] = {}
        stop = threading.Event()

        def producer() -> None:
            n, start = 0, time.monotonic()
            while not stop.is_set():
                label = f"busy-{n}"
                pushed[label] = time.time()
                _push([label])
                n += 1
                time.sleep(max(0.0, start + n / rate - time.monotonic()))

        thread = threading.Thread(target=producer, daemon=True)
        try:
            thread.start()
            for k in range(kills):
                time.sleep(every_s)
                victim = workers[k % 2]
                victim.kill()
                victim.start()
            stop.set()
            thread.join()
            _settle(client, pushed)
            waits = _waits(client, pushed)
        finally:
            stop.set()
            for worker in workers:
                worker.stop()
    return _verdict(waits, kills)


def _settle(client, pushed: dict[str, float]) -> None:  # type: ignore[no-untyped-def]
    with contextlib.suppress(TimeoutError):
        _wait_done(client, list(pushed), SETTLE_S)


def throughput_round(code: Path | None, n: int, log_dir: Path) -> dict:
    """``n`` no-op tasks through one worker x 2, first push to last run."""
    with private_redis() as server:
        setup_django(server.url)
        _point_at(server.url)
        client = server.client(decode_responses=True)
        worker = _worker(server.url, log_dir, "tp-w", code, (QUEUE,)).start()
        try:
            labels = [f"tp-{i}" for i in range(n)]
            _push(labels[:1])
            _wait_done(client, labels[:1], 60)
            cpu, commands = _cpu_s([server.pid]), command_counts(client)
            t0 = time.perf_counter()
            _push(labels[1:])
            _wait_done(client, labels[1:], 600)
            elapsed = time.perf_counter() - t0
            cpu = _cpu_s([server.pid]) - cpu
            used = diff_counts(command_counts(client), commands)
        finally:
            worker.stop()
    # The bench's own reads of progress (LLEN) are not the task's.
    per_task = (sum(used.values()) - used.get("llen", 0)) / (n - 1)
    return {
        "tasks_per_s": round((n - 1) / elapsed, 1),
        "redis_cpu_us_per_task": round(cpu * 1e6 / (n - 1), 1),
        "redis_commands_per_task": round(per_task, 2),
    }


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--every", type=float, default=2.0)
    parser.add_argument("--noop", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=6, help="throughput pairs")
    args = parser.parse_args()
    result: dict = {"sizes": vars(args), "before": {}, "after": {}}
    with before_checkout() as old, tempfile.TemporaryDirectory(prefix="relier-pop-") as logs:
        log_dir = Path(logs)
        versions = {"before": old, "after": None}
        for name, code in versions.items():
            result[name]["idle"] = idle_round(code, args.kills, log_dir)
            print(f"{name:6} idle: {result[name]['idle']}", flush=True)
            result[name]["busy"] = busy_round(code, args.kills, args.rate, args.every, log_dir)
            print(f"{name:6} busy: {result[name]['busy']}", flush=True)
        tp: dict[str, list[dict]] = {"before": [], "after": []}
        for r in range(args.rounds):  # alternate, so the machine's drift falls on both
            for name in ("before", "after") if r % 2 == 0 else ("after", "before"):
                tp[name].append(throughput_round(versions[name], args.noop, log_dir))
        for name, runs in tp.items():
            result[name]["throughput"] = {
                key: round(statistics.median(run[key] for run in runs), 2) for key in runs[0]
            }
            print(f"{name:6} throughput: {result[name]['throughput']}", flush=True)
    before, after = result["before"]["throughput"], result["after"]["throughput"]
    result["after_over_before"] = {key: round(after[key] / before[key], 3) for key in after}
    print(f"after / before: {result['after_over_before']}")
    small = args.kills < 50 or args.noop != 2000
    path = write("pop-trace-small" if small else "pop-trace", result)
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
