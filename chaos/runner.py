"""One scenario's run: start the cluster, push the workload, let the scenario inject
its faults, wait for quiescence, collect the evidence, check the invariants.

A scenario is a function of a :class:`Run`; the run owns every process (through its
:class:`~chaos.supervisor.Cluster`), the seeded random generator, the record of pushes
and faults, and the scenario's own extra checks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from . import evidence as evidence_mod
from . import invariants
from .evidence import Evidence, Pushed
from .invariants import Check
from .report import Fault, Report, latency_summary, recovery_latencies
from .supervisor import FAST_ENV, HEARTBEAT_TTL_S, SCAN_INTERVAL_S, Cluster

SMALL_TASKS = 20
FULL_TASKS = 500


@dataclass(frozen=True)
class Options:
    tasks: int = FULL_TASKS
    workers: int = 2
    seed: int = 7
    keep: bool = False  # keep the run directory (logs, journal, Redis data) on success too


@dataclass(frozen=True)
class Item:
    """One task of the workload, before it is pushed."""

    task: Any  # an @rl_task (RelierTask)
    label: str
    kwargs: dict[str, Any]
    expect: str = "commit"


# -- this process: Django, and where it pushes to -------------------------------------------
_django_ready = False


def _setup_django() -> None:
    """Django for this process. Where it pushes to is set per scenario (``pointed_at``);
    no connection is made before that."""
    global _django_ready
    if _django_ready:
        return
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    os.environ.setdefault("TESTPROJECT_POSTGRES_URL", "")  # the workload needs no database
    import django

    django.setup()
    _django_ready = True


@contextlib.contextmanager
def pointed_at(env: Mapping[str, str], celery_conf: Mapping[str, Any] | None = None):  # type: ignore[no-untyped-def]
    """This process's relier config and Celery app follow ``env`` (as a worker's would)
    and ``celery_conf`` until the block ends; everything is restored after."""
    from testproject.harness import process_pointed_at

    names = {n: v for n, v in env.items() if n.startswith(("RELIER_", "CELERY_"))}
    with process_pointed_at(names, **dict(celery_conf or {})):
        yield


@contextlib.contextmanager
def _logs_to(path: Path):  # type: ignore[no-untyped-def]
    """relier's log lines from this process (the producer's) go to ``path``, not the
    console, while a scenario runs: the console is for the report."""
    logger = logging.getLogger("relier_django")
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    saved = logger.handlers[:]
    logger.handlers = [handler]
    try:
        yield
    finally:
        logger.handlers = saved
        handler.close()


# -- the run --------------------------------------------------------------------------------
@dataclass
class Run:
    name: str
    opts: Options
    run_dir: Path
    report: Report
    env: dict[str, str] = field(default_factory=dict)  # the scenario's RELIER_*/CELERY_*
    pushed: dict[str, Pushed] = field(default_factory=dict)
    push_failures: list[str] = field(default_factory=list)
    quiescence_timeout_s: float = 0.0
    client_factory: Callable[[], redis.Redis] | None = None  # default: the cluster's Redis
    _verifiers: list[Callable[[Evidence], list[Check]]] = field(default_factory=list)
    _producers: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _client: redis.Redis | None = None

    def __post_init__(self) -> None:
        self.rng = random.Random(f"{self.opts.seed}:{self.name}")  # per scenario, repeatable
        self.cluster = Cluster(self.run_dir, env=dict(self.env))
        self.journal = self.run_dir / "journal"
        self.journal.mkdir(parents=True, exist_ok=True)
        if not self.quiescence_timeout_s:
            self.quiescence_timeout_s = 90 + self.opts.tasks * 0.4

    @property
    def n(self) -> int:
        return self.opts.tasks

    @property
    def client(self) -> redis.Redis:
        """A client straight to the run's Redis (never through a proxy), reconnecting
        by itself after a restart."""
        if self.client_factory is not None:
            return self.client_factory()
        if self._client is None:
            assert self.cluster.redis is not None
            self._client = self.cluster.redis.client(decode_responses=True)
        return self._client

    def setting(self, name: str) -> str:
        return {**FAST_ENV, **self.env}.get(name, "")

    # -- processes ---------------------------------------------------------------------
    def start(self, workers: int | None = None, resurrector: bool = True) -> None:
        """Start the workers (in parallel) and the standalone resurrector."""
        count = self.opts.workers if workers is None else workers
        started = []
        for i in range(count):
            slot = f"w{i + 1}"
            started.append(self.cluster.start_worker_nowait(slot))
        for worker in started:
            worker.wait_ready(90)
        if resurrector:
            self.cluster.start_resurrector()

    # -- the workload ------------------------------------------------------------------
    def items(
        self, count: int, work_s: tuple[float, float] = (0.2, 0.6), prefix: str = ""
    ) -> list[Item]:
        """``count`` workload tasks, plain ``def`` and ``async def`` mixed (seeded)."""
        from testproject.demo import tasks

        out = []
        for i in range(count):
            task = tasks.chaos_step if self.rng.random() < 0.5 else tasks.achaos_step
            work = round(self.rng.uniform(*work_s), 3)
            label = f"{self.name}-{prefix}{i}"
            out.append(Item(task, label, {"journal": str(self.journal), "work_s": work}))
        return out

    def push(
        self, item: Item, task_id: str | None = None, countdown_s: float | None = None
    ) -> Pushed:
        """Push ``item`` (due ``countdown_s`` from now on the store's clock, if given)."""
        from relier_django.core.model.timing import timing
        from relier_django.core.push import producer

        task_id = task_id or uuid.uuid4().hex
        kwargs = {"label": item.label, **item.kwargs}
        when = timing(countdown=countdown_s)
        producer.push(item.task.relier_spec, item.task.app, (), kwargs, task_id=task_id, when=when)
        record = Pushed(task_id, item.label, item.task.name, item.expect, time.time())
        with self._lock:
            if not self.report.started_at:
                self.report.started_at = record.at
            self.pushed[task_id] = record
        return record

    def push_all(self, items: list[Item]) -> list[Pushed]:
        return [self.push(item) for item in items]

    def produce(self, items: list[Item], over_s: float) -> threading.Thread:
        """Push ``items`` evenly over ``over_s`` seconds from a producer thread."""
        pause = over_s / max(1, len(items))

        def loop() -> None:
            for item in items:
                try:
                    self.push(item)
                except Exception as exc:  # not acknowledged: not counted as pushed
                    self.push_failures.append(f"{item.label}: {type(exc).__name__}: {exc}")
                time.sleep(pause)

        thread = threading.Thread(target=loop, name="chaos-producer", daemon=True)
        self._producers.append(thread)
        thread.start()
        return thread

    # -- faults and observations ---------------------------------------------------------
    def fault(self, text: str, interrupts: bool = True, pids: Iterable[int] = ()) -> None:
        """Record a fault; ``pids``: the processes it took or froze (none: all of them)."""
        fault = Fault(time.time(), text, interrupts, tuple(sorted(pids)))
        if not self.report.started_at:
            self.report.started_at = fault.at
        self.report.faults.append(fault)
        print(f"  {fault.at - self.report.started_at:+8.2f} s  {text}", flush=True)

    def note(self, text: str) -> None:
        self.report.notes.append(text)

    def verify(self, fn: Callable[[Evidence], list[Check]]) -> None:
        """Add scenario-specific checks, computed from the evidence after the drain."""
        self._verifiers.append(fn)

    def task_states(self, ids: list[str] | None = None) -> dict[str, dict[str, str]]:
        keys = evidence_mod.KEYS
        ids = list(self.pushed) if ids is None else ids
        pipe = self.client.pipeline(transaction=False)
        for task_id in ids:
            pipe.hmget(keys.task(task_id), "state", "fence", "worker")
        out = {}
        for task_id, (state, fence, worker) in zip(ids, pipe.execute(), strict=True):
            if state is not None:
                out[task_id] = {"state": state, "fence": fence or "0", "worker": worker or ""}
        return out

    def running_on(self, hostname: str) -> dict[str, int]:
        """Task id -> fence of the pushed tasks running in a process of ``hostname``."""
        return {
            task_id: int(s["fence"])
            for task_id, s in self.task_states().items()
            if s["state"] == "running" and s["worker"].startswith(f"{hostname}:")
        }

    def wait_running_on(self, hostname: str, timeout_s: float = 30) -> dict[str, int]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if running := self.running_on(hostname):
                return running
            time.sleep(0.05)
        return {}

    def ended(self) -> int:
        """How many workload runs have finished so far (journal ``end`` records)."""
        return sum(1 for e in evidence_mod.read_journal(self.journal) if e.event == "end")

    # -- quiescence ----------------------------------------------------------------------
    def queued(self) -> dict[str, int]:
        """What the broker still holds: kombu's lists and unacked hash in Redis, or the
        RabbitMQ node's queues (ready and unacknowledged) when the cluster runs one."""
        if self.cluster.rabbit is not None:
            return evidence_mod.rabbit_queued(self.cluster.rabbit)
        return evidence_mod.queued(self.client)

    def _drained(self) -> tuple[bool, str]:
        if any(t.is_alive() for t in self._producers):
            return False, "producers still pushing"
        client = self.client
        outcomes = evidence_mod.read_outcomes(client, list(self.pushed))
        waiting = sum(1 for o in outcomes.values() if o is None)
        busy = evidence_mod.in_flight(client)
        # Reading RabbitMQ's queues runs rabbitmqctl (about a second of CPU): only once
        # the store says the rest is done.
        if self.cluster.rabbit is None or (waiting == 0 and not any(busy.values())):
            busy.update(self.queued())
        state = f"{waiting} without an outcome; " + ", ".join(f"{k} {n}" for k, n in busy.items())
        return waiting == 0 and not any(busy.values()), state

    def wait_quiescent(self, settle_s: float = 2.0) -> float | None:
        """Until every pushed task has an outcome, nothing is in flight and the queues
        (and kombu's unacknowledged set) are empty, for ``settle_s`` in a row. Returns
        the time it first became so, or None on timeout."""
        deadline = time.monotonic() + self.quiescence_timeout_s
        since: float | None = None
        state = ""
        while time.monotonic() < deadline:
            try:
                done, state = self._drained()
            except (redis.exceptions.RedisError, RuntimeError, OSError) as exc:
                # Down, restarting, or mid-failover (the sentinels disagree), or a
                # rabbitmqctl that failed (RabbitError is a RuntimeError): not drained.
                done, state = False, f"Redis or the broker unreachable ({type(exc).__name__})"
            if done:
                since = since or time.time()
                if time.time() - since >= settle_s:
                    return since
            else:
                since = None
            time.sleep(0.25)
        self.note(f"no quiescence within {self.quiescence_timeout_s:.0f} s: {state}")
        return None

    def collect(self) -> Evidence:
        return evidence_mod.collect(
            self.client, self.pushed, self.journal, self.cluster.log_paths(), self.queued()
        )

    def scenario_checks(self, ev: Evidence) -> list[Check]:
        out: list[Check] = []
        for fn in self._verifiers:
            out.extend(fn(ev))
        return out


def timings(run: Run, ev: Evidence, quiet_at: float | None) -> dict[str, str]:
    out: dict[str, str] = {}
    start = run.report.started_at
    if quiet_at is not None:
        out["time to quiescence"] = f"{quiet_at - start:.2f} s from the first push"
        if run.report.faults:
            last = max(f.at for f in run.report.faults)
            out["after the last fault event"] = f"{quiet_at - last:.2f} s"
    else:
        out["time to quiescence"] = f"not reached within {run.quiescence_timeout_s:.0f} s"
    ttl = float(run.setting("RELIER_HEARTBEAT_TTL_S") or HEARTBEAT_TTL_S)
    scan = float(run.setting("RELIER_SCAN_INTERVAL_S") or SCAN_INTERVAL_S)
    if any(f.interrupts for f in run.report.faults):
        lat = recovery_latencies(ev.executions, run.report.faults)
        # From the fault to the task running again: detection (TTL + scan) plus any
        # wait for a free pool process behind the survivors' own backlog.
        out["recovery latency"] = (
            f"{latency_summary(lat)}  (fault -> running again, queueing included; "
            f"detection bound TTL + scan + 1 = {ttl + scan + 1:.1f} s)"
        )
    starts = [e for e in ev.executions if e.event == "start"]
    per_task: dict[str, int] = {}
    for e in starts:
        per_task[e.task_id] = per_task.get(e.task_id, 0) + 1
    again = sum(1 for n in per_task.values() if n > 1)
    out["executions"] = (
        f"{len(starts)} starts for {len(run.pushed)} tasks; {again} task(s) started more "
        "than once (interrupted or superseded runs; commits are counted above)"
    )
    return out


def execute(
    name: str,
    summary: str,
    body: Callable[[Run], None],
    opts: Options,
    env: Mapping[str, str] | None = None,
    setup: Callable[[Run], Mapping[str, Any] | None] | None = None,
    celery_conf: Mapping[str, Any] | None = None,
) -> Report:
    """Run one scenario from a fresh private Redis to its report. Every process it
    started is stopped before this returns, whatever happened."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"relier-chaos-{name}-"))
    report = Report(name, summary, opts.seed, opts.tasks, opts.workers, run_dir=str(run_dir))
    run = Run(name, opts, run_dir, report, env=dict(env or {}))
    report.settings = {
        "heartbeat TTL": f"{run.setting('RELIER_HEARTBEAT_TTL_S')} s",
        "scan": f"{run.setting('RELIER_SCAN_INTERVAL_S')} s",
        **{k: v for k, v in (env or {}).items() if k not in FAST_ENV},
    }
    finished = False  # False: interrupted (Ctrl-C, SIGTERM); nothing to keep for
    try:
        _setup_django()
        celery_conf = {**(celery_conf or {}), **((setup(run) if setup else None) or {})}
        if setup is None:
            run.cluster.start_redis()
        process_env = run.cluster.process_env()
        with pointed_at(process_env, celery_conf), _logs_to(run_dir / "runner.log"):
            body(run)
            quiet_at = run.wait_quiescent()
            ev = run.collect()
        report.checks = invariants.check(ev) + run.scenario_checks(ev)
        report.timings = timings(run, ev, quiet_at)
        if run.push_failures:
            run.note(
                f"{len(run.push_failures)} push(es) raised (not acknowledged, not counted): "
                + "; ".join(run.push_failures[:3])
            )
        finished = True
    except Exception as exc:
        report.error = f"{type(exc).__name__}: {exc}"
        (run_dir / "error.txt").write_text(traceback.format_exc())
        finished = True
    finally:
        run.cluster.stop()
        if run._client is not None:
            run._client.close()
        if (report.ok or not finished) and not opts.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
            report.run_dir = ""
    return report
