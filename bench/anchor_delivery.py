"""The anchor contender of the delivery benchmark: the PyPI package ``relier`` 0.1.7.

It runs as its README tells its users to run it: Celery workers started with
``celery -A relier.tasks.app worker -Q high_priority,default,low_priority,re-queue
--include=<the tasks module>`` (each worker also runs its resurrection scanner) and one
``rl run-resurrector``, in its own venv (``bench.admission.ensure_anchor``), against a
private Redis of its own, with its default recovery settings: heartbeat TTL 10 s, scan
every 2 s, and its Celery app's own acks_late + reject_on_worker_lost, prefetch
multiplier 1 and kombu's default visibility timeout (1 h, so no redelivery of an
unacknowledged message falls within the run). The only setting changed is the
admission limit, raised so the producer's burst is never refused (admission is not
what this benchmark measures).

The task is the same work as the other contenders' (``demo.plain_work``): it records its
start (time and pid) and its run in Redis in the layout ``bench.delivery.snapshot``
reads. A commit is a run whose result came out of the anchor's wrapper as the task's
own return value (Celery's ``task_success`` signal): a run the anchor rejected or
discarded as stale returns its status instead, and is not counted.

Only the anchor's public API is called (``rl_task``, ``apush``); the worker-side code
below is written to a directory of the run and put on the anchor venv's path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from testproject.harness import CeleryWorker, stop_process

NAME = "anchor relier 0.1.7"
TASK_MODULE = "anchor_bench_tasks"
QUEUES = "high_priority,default,low_priority,re-queue"  # the README's worker command
HOW = (
    f"pip install relier==0.1.7 into .run/anchor-venv; 2 x `celery -A relier.tasks.app "
    f"worker -Q {QUEUES} --include={TASK_MODULE} --pool prefork --concurrency 2` and "
    "`rl run-resurrector` from it, on a private Redis; tasks pushed with apush()"
)

# The worker side: imported by the anchor's workers (--include).
TASKS = """
import os, time

import redis
from celery import signals
from relier import rl_task

_clients = {}


def _redis():
    pid = os.getpid()
    if pid not in _clients:
        _clients[pid] = redis.Redis.from_url(os.environ["RELIER_REDIS_URL"], decode_responses=True)
    return _clients[pid]


@rl_task(name="bench.anchor_work")
def anchor_work(label: str, sleep_s: float) -> str:
    _redis().rpush(f"demo:start:{label}", f"0:{time.time()}:{os.getpid()}")
    time.sleep(sleep_s)
    _redis().rpush(f"demo:exec:{label}", "0")
    return label


@signals.task_success.connect(weak=False)
def _committed(sender=None, result=None, **_):
    # A run the anchor refused or discarded returns a status dict, not the label.
    if getattr(sender, "name", "") == "bench.anchor_work" and isinstance(result, str):
        _redis().rpush(f"demo:commit:{result}", "1")
"""

# The producer: one event loop, one apush per label; prints the task ids.
PUSHER = """
import asyncio, json, sys

from anchor_bench_tasks import anchor_work

async def main():
    ids = []
    for label in json.loads(sys.argv[1]):
        ids.append((await anchor_work.apush(label, float(sys.argv[2]))).id)
    print(json.dumps(ids))

asyncio.run(main())
"""


def anchor_env(redis_url: str, code_dir: Path) -> dict[str, str]:
    """The anchor's processes' environment: none of ours (``RELIER_*`` names clash),
    its Redis, the tasks module on its path."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RELIER_", "CELERY_", "DJANGO_")) and k != "PYTHONPATH"
    }
    env.update(
        {
            "RELIER_REDIS_URL": redis_url,
            "RELIER_ADMISSION_LIMIT": str(10**9),
            "PYTHONPATH": str(code_dir),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def write_code(code_dir: Path) -> Path:
    code_dir.mkdir(parents=True, exist_ok=True)
    (code_dir / f"{TASK_MODULE}.py").write_text(TASKS)
    return code_dir


@dataclass
class AnchorWorker(CeleryWorker):
    """An anchor worker, driven exactly as ``CeleryWorker`` (kills, restarts, stop)."""

    python: Path = field(default_factory=lambda: Path(sys.executable))
    code_dir: Path = field(default_factory=Path)

    @property
    def hostname(self) -> str:
        return f"{self.name}@relier-bench"

    def start(self, wait: bool = True, timeout_s: float = 60) -> AnchorWorker:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        args = [
            str(self.python), "-m", "celery", "-A", "relier.tasks.app", "worker",
            "-l", "info", "-Q", QUEUES, f"--include={TASK_MODULE}",
            "--pool", "prefork", "--concurrency", str(self.concurrency),
            "--hostname", self.hostname,
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the worker
        self._log_start = self.log_path.stat().st_size
        self.process = subprocess.Popen(
            args, cwd=self.code_dir, env=anchor_env(self.redis_url, self.code_dir),
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        if wait:
            self.wait_ready(timeout_s)
        return self


@dataclass
class AnchorResurrector:
    """``rl run-resurrector``, the README's dedicated recovery process."""

    python: Path
    redis_url: str
    code_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> AnchorResurrector:
        rl = self.python.parent / "rl"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.process = subprocess.Popen(
            [str(rl), "run-resurrector"], cwd=self.code_dir,
            env=anchor_env(self.redis_url, self.code_dir),
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        return self

    def stop(self) -> None:
        stop_process(self.process)
        if self.process is not None:
            self._log.close()


def push_all(python: Path, redis_url: str, code_dir: Path, labels: list[str], sleep_s: float):
    done = subprocess.run(
        [str(python), "-c", PUSHER, json.dumps(labels), str(sleep_s)],
        cwd=code_dir, env=anchor_env(redis_url, code_dir),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"the anchor's producer failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def start(redis_url: str, log_dir: Path, sleep_s: float):
    """The anchor's 2 workers and its resurrector, on ``redis_url``; returns the
    workers, the push (labels -> task ids) and the other processes, as
    ``bench.delivery`` drives every contender."""
    from bench.admission import ensure_anchor

    python = ensure_anchor()
    code = write_code(log_dir / "anchor-code")
    workers = [
        AnchorWorker(redis_url, log_dir, name=f"anchor-w{i}", python=python, code_dir=code)
        for i in range(2)
    ]
    resurrector = AnchorResurrector(python, redis_url, code, log_dir / "resurrector.log")
    try:
        resurrector.start()
        for worker in workers:
            worker.start()
    except BaseException:
        for worker in workers:
            worker.stop()
        resurrector.stop()
        raise

    def push(labels: list[str]) -> list[str]:
        return push_all(python, redis_url, code, labels, sleep_s)

    return workers, push, [resurrector]
