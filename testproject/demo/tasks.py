"""Example tasks used by the tests, the chaos runner and the demo.

Each relier task records every execution in Redis (``demo:exec:<label>``: one entry
per run, with its fence), so a test can count runs independently of commits.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import redis
from celery import shared_task, signals

from relier_django import TaskContext, rl_task
from relier_django.core.model import config
from relier_django.core.store.connection import async_client, sync_client


def _redis() -> redis.Redis:
    # relier's own client for this process: the same Redis (through Sentinel when
    # configured), a socket of this process's own, retried across a restart.
    return sync_client(config.current())


def _record(label: str, ctx: TaskContext | None = None) -> int:
    """Append one execution record; returns how many times ``label`` has run."""
    entry = f"{ctx.fence_token}:{ctx.worker}" if ctx else "-"
    return int(_redis().rpush(f"demo:exec:{label}", entry))


@shared_task(name="demo.plain_record")
def plain_record(label: str, sleep_s: float = 0.0) -> str:
    """A vanilla Celery task: records each execution, so a test can count runs."""
    if sleep_s:
        time.sleep(sleep_s)
    _redis().incr(f"demo:plain:{label}")
    return label


# The demo tasks talk to Redis themselves, so a Redis restart can fail them: retried.
@rl_task(name="demo.record", retry_on=(redis.exceptions.ConnectionError,), retry_backoff=0.2)
async def record(ctx: TaskContext, label: str, sleep_s: float = 0.0) -> dict:
    """An async task: sleeps, records its run, returns who ran it."""
    if sleep_s:
        await asyncio.sleep(sleep_s)
    runs = _record(label, ctx)
    return {"label": label, "fence": ctx.fence_token, "runs": runs}


@rl_task(name="demo.sync_record")
def sync_record(ctx: TaskContext, label: str, sleep_s: float = 0.0) -> dict:
    """The same as ``record``, as a plain ``def`` (runs in Celery's pool thread)."""
    if sleep_s:
        time.sleep(sleep_s)
    runs = _record(label, ctx)
    return {"label": label, "fence": ctx.fence_token, "runs": runs}


@rl_task(name="demo.watch_fence")
def watch_fence(ctx: TaskContext, label: str, max_s: float) -> dict:
    """Runs until it learns it was superseded (or ``max_s``); records what it saw and
    the thread it ran in."""
    deadline = time.monotonic() + max_s
    while ctx.is_current() and time.monotonic() < deadline:
        time.sleep(0.05)
    seen = "superseded" if not ctx.is_current() else "current"
    _redis().rpush(f"demo:watch:{label}", f"{seen}:{threading.current_thread().name}")
    return {"seen": seen}


@rl_task(name="demo.charge", idempotent=True)
def charge(ctx: TaskContext, order_id: str, amount: int, sleep_s: float = 0.0) -> dict:
    """An idempotent task: N pushes of one (order_id, amount) charge once."""
    if sleep_s:
        time.sleep(sleep_s)
    _record(f"charge:{order_id}", ctx)
    return {"order_id": order_id, "amount": amount, "task_id": ctx.task_id}


@rl_task(name="demo.refund", idempotent=True)
def refund(ctx: TaskContext, order_id: str, amount: int, sleep_s: float = 0.0) -> dict:
    """Same arguments as ``charge``, a different task: never shares its result."""
    _record(f"refund:{order_id}", ctx)
    return {"refunded": order_id, "task_id": ctx.task_id}


@rl_task(name="demo.flaky", retry_on=(TimeoutError,), max_retries=3, retry_backoff=0.05)
def flaky(ctx: TaskContext, label: str, failures: int) -> dict:
    """Raises TimeoutError on its first ``failures`` runs, then succeeds."""
    runs = _record(label, ctx)
    if runs <= failures:
        raise TimeoutError(f"run {runs} of {label} timed out")
    return {"runs": runs, "attempt": ctx.attempt, "fence": ctx.fence_token}


@rl_task(name="demo.explode", idempotent=True)
def explode(label: str) -> None:
    """Always raises: lands in the DLQ with reason ``exception``."""
    _record(label)
    raise ValueError(f"cannot process {label}")


@rl_task(name="demo.until_fixed")
def until_fixed(ctx: TaskContext, label: str, note: str = "") -> dict:
    """Raises while ``demo:broken:<label>`` exists: an operator "fixes" it by deleting
    that key, then releases the DLQ entry, and the task runs once more and commits."""
    runs = _record(label, ctx)
    if _redis().exists(f"demo:broken:{label}"):
        raise ValueError(f"{label} is broken ({note})" if note else f"{label} is broken")
    return {"label": label, "runs": runs, "fence": ctx.fence_token}


@rl_task(name="demo.unserializable")
def unserializable(label: str) -> object:
    _record(label)
    return object()


@rl_task(name="demo.big_result")
def big_result(ctx: TaskContext, label: str, size: int) -> str:
    """Records its run and returns a string of ``size`` characters (RESULT_MAX_BYTES)."""
    _record(label, ctx)
    return "x" * size


@rl_task(name="demo.noop")
async def noop() -> None:
    """Does nothing: for overhead benchmarks."""


@shared_task(name="demo.plain_noop")
def plain_noop() -> None:
    """Vanilla Celery no-op: the baseline of the overhead benchmarks."""


@rl_task(name="demo.self_destruct", max_resurrections=2)
def self_destruct(ctx: TaskContext, label: str) -> None:
    """Kills the process running it, every time: a poison task for the resurrection limit."""
    import os
    import signal

    _record(label, ctx)
    os.kill(os.getpid(), signal.SIGKILL)


def _mark_start(label: str, fence: int) -> None:
    # The process too: a benchmark tells which kill interrupted which run.
    _redis().rpush(f"demo:start:{label}", f"{fence}:{time.time()}:{os.getpid()}")


@shared_task(name="demo.plain_work")
def plain_work(label: str, sleep_s: float) -> None:
    """Vanilla Celery contender of the delivery benchmark: logs each start and run."""
    _mark_start(label, 0)
    time.sleep(sleep_s)
    _redis().rpush(f"demo:exec:{label}", "0")


@rl_task(name="demo.work")
def work(ctx: TaskContext, label: str, sleep_s: float) -> None:
    """relier contender of the delivery benchmark: the same work, fenced."""
    _mark_start(label, ctx.fence_token)
    time.sleep(sleep_s)
    _redis().rpush(f"demo:exec:{label}", str(ctx.fence_token))


@rl_task(name="demo.fragile", max_resurrections=1)
def fragile(ctx: TaskContext, label: str, deaths: int) -> dict:
    """Kills the process running it on its first ``deaths`` runs, then succeeds."""
    import os
    import signal

    runs = _record(label, ctx)
    if runs <= deaths:
        os.kill(os.getpid(), signal.SIGKILL)
    return {
        "runs": runs,
        "fence": ctx.fence_token,
        "attempt": ctx.attempt,
        "resurrections": ctx.resurrections,
    }


@rl_task(name="demo.dies_once", max_resurrections=1, keep_trail=True)
def dies_once(ctx: TaskContext, label: str, how: str) -> int:
    """Its first run ends its own process: ``how`` is a signal name (``SIGKILL``,
    ``SIGSEGV``) or ``exit:<code>`` (``os._exit``), or ``sleep:<s>`` (it sleeps, for a
    test to kill the whole worker meanwhile); the next run returns its fence. Its
    history is kept after the commit (``keep_trail``), for a test to read."""
    import os
    import signal

    if _record(label, ctx) == 1:
        if how.startswith("sleep:"):
            time.sleep(float(how.removeprefix("sleep:")))
        elif how.startswith("exit:"):
            os._exit(int(how.removeprefix("exit:")))
        os.kill(os.getpid(), signal.Signals[how])
    return ctx.fence_token


@rl_task(name="demo.hog", max_resurrections={"oom": 0, "default": 3}, keep_trail=True)
def hog(ctx: TaskContext, label: str, mib: int, sleep_s: float = 0.0) -> int:
    """Sleeps ``sleep_s`` (for a test to kill its worker meanwhile), then fills ``mib``
    MiB on its first run: past its process's memory limit the OOM killer ends it (a
    memory cgroup) or the allocation raises MemoryError (RLIMIT_AS). Its policy
    quarantines an OOM at once and brings any other death back up to 3 times; a later
    run returns its fence."""
    if _record(label, ctx) == 1:
        time.sleep(sleep_s)
        block = b"x" * (mib << 20)  # written, so every page is really charged
        return len(block)
    return ctx.fence_token


async def _soft_hook(ctx: TaskContext) -> None:
    """The soft-timeout hook: note it ran, and checkpoint where the task got to."""
    _redis().rpush(f"demo:soft:{ctx.task_id}", ctx.fence_token)
    await ctx.aset_partial({**(ctx.get_partial() or {}), "soft_timeout": True})


@rl_task(name="demo.slow_steps", soft_timeout=0.8, hard_timeout=2.0, on_soft_timeout=_soft_hook)
async def slow_steps(ctx: TaskContext, label: str, steps: int, step_s: float) -> dict:
    """Checkpoints each step; too slow for its hard timeout when steps x step_s > 2 s."""
    _record(label, ctx)
    try:
        for step in range(steps):
            await ctx.aset_partial({**(ctx.get_partial() or {}), "step": step})
            await asyncio.sleep(step_s)
        return {"label": label, "steps": steps}
    finally:
        _redis().rpush(f"demo:finally:{label}", ctx.fence_token)


@rl_task(name="demo.resumable")
def resumable(ctx: TaskContext, label: str, steps: int, step_s: float) -> dict:
    """Resumes from its checkpoint: records the step each incarnation started at."""
    start = (ctx.get_partial() or {}).get("next", 0)
    _redis().rpush(f"demo:resumed:{label}", start)
    for step in range(start, steps):
        time.sleep(step_s)
        ctx.set_partial({"next": step + 1})
    return {"label": label, "started_at": start}


@rl_task(name="demo.fix_then_resume")
def fix_then_resume(ctx: TaskContext, label: str) -> dict:
    """Checkpoints phase 1, then fails while ``demo:broken:<label>`` exists; released
    after the fix, it resumes from the checkpoint instead of redoing phase 1."""
    seen = ctx.get_partial()
    _redis().rpush(f"demo:seen:{label}", json.dumps(seen))
    if seen is None:
        ctx.set_partial({"phase": 1})
    if _redis().exists(f"demo:broken:{label}"):
        raise ValueError(f"{label} is broken")
    return {"label": label, "resumed_from": seen}


@rl_task(name="demo.checkpoint_bytes")
async def checkpoint_bytes(ctx: TaskContext, size: int, saves: int = 1) -> dict:
    """Saves a checkpoint of about ``size`` bytes ``saves`` times; returns the read-back
    length and how many checkpoint files exist then (under ``CHECKPOINT_DIR``, if set)."""
    for n in range(saves):
        await ctx.aset_partial(str(n % 10) * size)
    folder = config.current().checkpoint_dir
    found = await asyncio.to_thread(lambda: list(Path(folder).rglob("*.json"))) if folder else []
    files = len(found)
    return {"bytes": len(ctx.get_partial()), "files": files}


@rl_task(name="demo.limited", admission_limit="3/m")
def limited(label: str) -> str:
    """Admission-controlled: at most 3 pushes a minute are accepted."""
    _record(label)
    return label


def _broken_hook(ctx: TaskContext) -> None:
    raise RuntimeError("the soft hook itself failed")


@rl_task(name="demo.stubborn", soft_timeout=0.3, hard_timeout=1.0, on_soft_timeout=_broken_hook)
async def stubborn(ctx: TaskContext, label: str) -> str:
    """Swallows its cancellation and returns anyway; its soft hook raises."""
    _record(label, ctx)
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        return "swallowed"
    return "slept"


@rl_task(name="demo.connection_info")
async def connection_info(ctx: TaskContext, sleep_s: float = 0.0) -> dict:
    """Which Redis connections relier gives this pool process: its PID, and for the
    sync client and the event loop's async client, ``CLIENT INFO`` as the server sees
    it (``id``, and ``name``: ``relier:<pid of the process that opened it>``)."""
    if sleep_s:
        await asyncio.sleep(sleep_s)
    cfg = config.current()
    sync = sync_client(cfg).client_info()
    aio = await async_client(cfg).client_info()
    return {
        "pid": os.getpid(),
        "sync": {"id": int(sync["id"]), "name": sync["name"]},
        "async": {"id": int(aio["id"]), "name": aio["name"]},
    }


@rl_task(name="demo.count_users")
def count_users(label: str, username: str, using: str = "default") -> int:
    """Counts the users named ``username`` in database ``using``, as this worker sees
    them, and records the count: what a task sees of its producer's transaction.
    (A task parameter may be called ``using``: push options go through push_with().)"""
    from django.contrib.auth.models import User

    seen = User.objects.using(using).filter(username=username).count()
    _redis().rpush(f"demo:seen:{label}", seen)
    return seen


@rl_task(name="demo.per_second", admission_limit="2/s")
def per_second(label: str) -> str:
    """Admission-controlled per second: a refusal's Retry-After is under a second."""
    _record(label)
    return label


# --- Rolling deploys: one task, two schema versions ---------------------------------------
# DEMO_VERSIONED_SCHEMA (read at import) picks the version this process has, so a test can
# run an "old" and a "new" worker side by side: v1 took (label, cents); v2 takes
# (label, amount, currency), and migrates v1 pushes.


def _versioned_schema() -> int:
    import os

    return int(os.environ.get("DEMO_VERSIONED_SCHEMA", "1"))


def cents_to_amount(args: list, kwargs: dict) -> tuple[list, dict]:
    """Migration v1 -> v2. Binds by name, so positional and keyword pushes both work."""
    call = {**dict(zip(("label", "cents"), args, strict=False)), **kwargs}
    cents = call.pop("cents")
    return [], {**call, "amount": f"{cents / 100:.2f}", "currency": "EUR"}


if _versioned_schema() >= 2:

    @rl_task(name="demo.versioned", version=2, migrations={1: cents_to_amount})
    def versioned(ctx: TaskContext, label: str, amount: str, currency: str) -> dict:
        """v2. Raises for labels starting with "fail" (to show a failed run's stored copy)."""
        _record(label, ctx)
        if label.startswith("fail"):
            raise ValueError(f"{label}: refused {amount} {currency}")
        return {"schema": 2, "label": label, "amount": amount, "currency": currency}

else:

    @rl_task(name="demo.versioned")
    def versioned(ctx: TaskContext, label: str, cents: int) -> dict:  # type: ignore[misc]
        """v1."""
        _record(label, ctx)
        return {"schema": 1, "label": label, "cents": cents}


# --- Rolling deploys: a worker from before a task existed ---------------------------------
# DEMO_WORKER_LACKS="demo.record,demo.sync_record" (read as the worker sets up) drops those
# tasks from this worker's registry before its consumer starts, so their messages reach
# Celery's task_unknown, as on a worker still running the previous release. Unset, nothing
# changes.


@signals.celeryd_after_setup.connect(dispatch_uid="demo.worker_lacks", weak=False)
def _lack_tasks(sender: Any = None, instance: Any = None, **_: Any) -> None:
    lacking = [n.strip() for n in os.environ.get("DEMO_WORKER_LACKS", "").split(",") if n.strip()]
    for name in lacking:
        instance.app.tasks.pop(name, None)


# --- The chaos runner's workload (chaos/, docs/chaos.md) ------------------------------
# Each incarnation journals its start and its end to a file of its own process
# (<journal>/exec-<pid>.jsonl): files, not Redis, so the record survives every fault the
# runner injects into Redis, the network or the worker. One write(2) per line with
# O_APPEND: a SIGKILL leaves whole lines. chaos/evidence.py reads this format.


def _journal(directory: str, event: str, ctx: TaskContext, label: str) -> None:
    import os

    line = json.dumps(
        {"ev": event, "id": ctx.task_id, "fence": ctx.fence_token, "label": label,
         "pid": os.getpid(), "worker": ctx.worker, "t": time.time()}
    )  # fmt: skip
    path = os.path.join(directory, f"exec-{os.getpid()}.jsonl")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@rl_task(name="demo.chaos_step")
def chaos_step(ctx: TaskContext, label: str, journal: str, work_s: float = 0.0) -> dict:
    """Chaos workload (plain ``def``, runs in a thread): journals start and end."""
    _journal(journal, "start", ctx, label)
    time.sleep(work_s)
    _journal(journal, "end", ctx, label)
    return {"label": label, "fence": ctx.fence_token}


@rl_task(name="demo.achaos_step")
async def achaos_step(ctx: TaskContext, label: str, journal: str, work_s: float = 0.0) -> dict:
    """Chaos workload (``async def``, cancellable): journals start and end."""
    _journal(journal, "start", ctx, label)
    await asyncio.sleep(work_s)
    _journal(journal, "end", ctx, label)
    return {"label": label, "fence": ctx.fence_token}


@rl_task(name="demo.chaos_poison", max_resurrections=2)
def chaos_poison(ctx: TaskContext, label: str, journal: str) -> None:
    """Kills the pool process running it, every time (after journaling its start)."""
    import os
    import signal

    _journal(journal, "start", ctx, label)
    os.kill(os.getpid(), signal.SIGKILL)


async def _chaos_soft(ctx: TaskContext) -> None:
    label = (ctx.get_partial() or {}).get("label", "")
    _journal((ctx.get_partial() or {}).get("journal", "."), "soft", ctx, label)


@rl_task(name="demo.chaos_slow", soft_timeout=0.5, hard_timeout=1.5, on_soft_timeout=_chaos_soft)
async def chaos_slow(ctx: TaskContext, label: str, journal: str, steps: int, step_s: float) -> dict:
    """Checkpoints every step; over its hard timeout when steps x step_s > 1.5 s."""
    _journal(journal, "start", ctx, label)
    for step in range(steps):
        await ctx.aset_partial({"label": label, "journal": journal, "step": step})
        await asyncio.sleep(step_s)
    _journal(journal, "end", ctx, label)
    return {"label": label, "fence": ctx.fence_token}


@rl_task(name="demo.def_hangs", soft_timeout=0.5, hard_timeout=1.5)
def def_hangs(ctx: TaskContext, label: str, hang_s: float) -> dict:
    """A plain ``def`` task past its time limits: catches Celery's soft limit to save a
    checkpoint, then hangs on until the hard limit kills its pool process."""
    from celery.exceptions import SoftTimeLimitExceeded

    _record(label, ctx)
    ctx.set_partial({"label": label, "soft": False})
    try:
        time.sleep(hang_s)
    except SoftTimeLimitExceeded:
        ctx.set_partial({"label": label, "soft": True})
        time.sleep(hang_s)
    return {"label": label}


@rl_task(name="demo.def_soft_escape", soft_timeout=0.5, hard_timeout=10)
def def_soft_escape(ctx: TaskContext, label: str, hang_s: float) -> dict:
    """A plain ``def`` task that lets Celery's soft time limit escape."""
    _record(label, ctx)
    ctx.set_partial({"label": label})
    time.sleep(hang_s)
    return {"label": label}


def _soft_limit() -> type[BaseException]:
    from celery.exceptions import SoftTimeLimitExceeded

    return SoftTimeLimitExceeded


@rl_task(
    name="demo.def_soft_retried", soft_time_limit=0.5, time_limit=10,
    autoretry_for=(_soft_limit(),), max_retries=1, retry_backoff=0.05,
)  # fmt: skip
def def_soft_retried(ctx: TaskContext, label: str, hang_s: float) -> dict:
    """The same, with the soft limit in ``retry_on`` (Celery's names): retried."""
    _record(label, ctx)
    time.sleep(hang_s)
    return {"label": label}


# Eager mode and captured pushes (relier_django.testing): these two record their runs
# in this process, not in Redis, so a test can prove the session's Redis stays empty.
EAGER_RUNS: dict[str, list[dict]] = {}


@rl_task(name="demo.in_memory", idempotent=True, retry_on=(TimeoutError,), max_retries=2)
def in_memory(ctx: TaskContext, label: str, failures: int = 0, error: str = "") -> dict:
    """Raises TimeoutError on its first ``failures`` runs (retried), ValueError(error)
    when ``error`` is given (not retried), else returns what it saw."""
    runs = EAGER_RUNS.setdefault(label, [])
    runs.append({"task_id": ctx.task_id, "partial": ctx.get_partial()})
    ctx.set_partial(len(runs))
    if error:
        raise ValueError(error)
    if len(runs) <= failures:
        raise TimeoutError(f"run {len(runs)} of {label} timed out")
    return {"label": label, "runs": len(runs), "task_id": ctx.task_id}


@rl_task(name="demo.ain_memory")
async def ain_memory(ctx: TaskContext, label: str, then: str = "") -> dict:
    """An ``async def`` twin; pushes ``in_memory(then)`` when ``then`` is given."""
    await asyncio.sleep(0)
    EAGER_RUNS.setdefault(label, []).append({"task_id": ctx.task_id})
    if then:
        await in_memory.apush(then)
    return {"label": label, "loop": type(asyncio.get_running_loop()).__name__}


# Celery's view of relier's tasks (issue 20): with DEMO_RECORD_CELERY_SIGNALS=1 in a
# worker's environment, what Celery's signals say of each task is appended, as JSON, to
# ``demo:celery:<task_id>``, so a test process can read what the worker's Celery saw.
class DemoError(Exception):
    """An exception of the project's own, so a test can see its type come through."""


@rl_task(name="demo.afails")
async def afails(label: str) -> None:
    """An ``async def`` task that always raises ``DemoError``: dead-lettered at once."""
    _record(label)
    raise DemoError(f"{label} failed")


def _celery_seen(task_id: str | None, **seen: Any) -> None:
    if task_id and os.environ.get("DEMO_RECORD_CELERY_SIGNALS"):
        _redis().rpush(f"demo:celery:{task_id}", json.dumps(seen, default=repr))


@signals.task_success.connect(dispatch_uid="demo.seen_success", weak=False)
def _seen_success(sender: Any = None, result: Any = None, **_: Any) -> None:
    _celery_seen(sender.request.id, signal="success", result=result)


@signals.task_failure.connect(dispatch_uid="demo.seen_failure", weak=False)
def _seen_failure(
    task_id: str | None = None, exception: Any = None, traceback: Any = None, **_: Any
) -> None:
    _celery_seen(
        task_id, signal="failure", type=type(exception).__name__,
        module=type(exception).__module__, message=str(exception),
        reason=getattr(exception, "reason", None), error=getattr(exception, "error", None),
        has_traceback=traceback is not None,
    )  # fmt: skip


@signals.task_retry.connect(dispatch_uid="demo.seen_retry", weak=False)
def _seen_retry(request: Any = None, reason: Any = None, **_: Any) -> None:
    exc = getattr(reason, "exc", None)
    _celery_seen(
        getattr(request, "id", None), signal="retry", type=type(exc).__name__,
        when=getattr(reason, "when", None),
    )  # fmt: skip


@signals.task_postrun.connect(dispatch_uid="demo.seen_postrun", weak=False)
def _seen_postrun(task_id: str | None = None, state: str | None = None, **_: Any) -> None:
    _celery_seen(task_id, signal="postrun", state=state)


# --- Scheduling (tests/integration/schedule/test_scheduling.py) ---------------------------------
@rl_task(name="demo.scheduled_at")
def scheduled_at(ctx: TaskContext, label: str) -> str | None:
    """Returns when the task was due, as the context says (None: pushed to run now)."""
    return ctx.scheduled_at.isoformat() if ctx.scheduled_at else None


@rl_task(name="demo.flaky_later", retry_on=(TimeoutError,), max_retries=3, retry_backoff=1.0)
def flaky_later(ctx: TaskContext, label: str, failures: int) -> dict:
    """Fails its first ``failures`` attempts; each retry waits about a second, in Redis."""
    if ctx.attempt <= failures:
        raise TimeoutError(f"attempt {ctx.attempt}")
    return {"label": label, "attempt": ctx.attempt}


# --- Scheduling under load and faults (bench/scheduling.py, chaos/scenarios/scheduling.py)
# Each start is timed on the Redis clock (TIME), the clock the due time was set on, so a
# start can be compared with its due time whatever the worker's own clock says.
def _redis_now_ms() -> int:
    seconds, micros = _redis().time()
    return int(seconds) * 1000 + int(micros) // 1000


@rl_task(name="demo.sched_probe")
def sched_probe(ctx: TaskContext, label: str, run: str) -> None:
    """Records ``<label>:<fence>:<due ms>:<start ms>`` in ``demo:sched:<run>`` (one list
    per run: a second entry for a label is a second run)."""
    started = _redis_now_ms()
    due = round(ctx.scheduled_at.timestamp() * 1000) if ctx.scheduled_at else -1
    _redis().rpush(f"demo:sched:{run}", f"{label}:{ctx.fence_token}:{due}:{started}")


@shared_task(name="demo.plain_sched", bind=True)
def plain_sched(self: Any, label: str, run: str) -> None:
    """Vanilla Celery twin of ``sched_probe``: its due time is the message's ETA."""
    from datetime import datetime

    started = _redis_now_ms()
    eta = self.request.eta
    due = round(datetime.fromisoformat(eta).timestamp() * 1000) if eta else -1
    _redis().rpush(f"demo:plain_sched:{run}", f"{label}:0:{due}:{started}")


@rl_task(name="demo.chaos_scheduled")
def chaos_scheduled(ctx: TaskContext, label: str, journal: str, work_s: float = 0.0) -> dict:
    """Chaos workload for scheduled tasks: ``chaos_step`` plus a line in
    ``<journal>/sched-<pid>.jsonl`` with its due time and its start on the Redis clock
    (``null`` if Redis was unreachable at that instant; the journal keeps local time)."""
    try:
        started: int | None = _redis_now_ms()
    except redis.exceptions.RedisError:
        started = None
    due = round(ctx.scheduled_at.timestamp() * 1000) if ctx.scheduled_at else None
    _journal(journal, "start", ctx, label)
    line = json.dumps({"id": ctx.task_id, "fence": ctx.fence_token, "due_ms": due,
                       "redis_ms": started, "t": time.time()})  # fmt: skip
    fd = os.open(os.path.join(journal, f"sched-{os.getpid()}.jsonl"),
                 os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)  # fmt: skip
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
    time.sleep(work_s)
    _journal(journal, "end", ctx, label)
    return {"label": label, "fence": ctx.fence_token}


# --- the fenced inbox (docs/transactions.md) ------------------------------------------


@rl_task(name="demo.book", atomic=True)
def book(ctx: TaskContext, label: str, hold_s: float = 0.0, die_after_commit: bool = False) -> dict:
    """Writes one ``Booking`` row in the inbox's transaction on the default database.

    ``hold_s``: sleep first, before any write (a window to SIGSTOP the incarnation in:
    SQLite takes its write lock at the first write). ``die_after_commit``: the first
    incarnation SIGKILLs its own process right after the database commit, before
    ``commit.lua`` (Django runs on_commit callbacks right after the outermost commit).
    """
    from django.db import transaction

    from testproject.demo.models import Booking

    _record(label, ctx)  # every run of the body, committed or not
    if hold_s:
        time.sleep(hold_s)
    Booking.objects.create(label=label, fence=ctx.fence_token)
    if die_after_commit and ctx.fence_token == 1:
        transaction.on_commit(lambda: os.kill(os.getpid(), 9))
    return {"label": label, "fence": ctx.fence_token}


# --- workflows (docs/workflows.md) ----------------------------------------------------


@rl_task(name="demo.step_add")
def step_add(ctx: TaskContext, x: int, y: int = 0, sleep_s: float = 0.0) -> int:
    """A chain step: ``x + y``, each run recorded under ``demo:exec:step:<task id>``
    and the ``x`` it got under ``demo:step-x:<task id>``. Raises while
    ``demo:broken:<y>`` is set, so a test can break one step and fix it."""
    _record(f"step:{ctx.task_id}", ctx)
    _redis().rpush(f"demo:step-x:{ctx.task_id}", json.dumps(x))
    if sleep_s:
        time.sleep(sleep_s)
    if _redis().exists(f"demo:broken:{y}"):
        raise RuntimeError(f"the step adding {y} is broken")
    return x + y


@rl_task(name="demo.step_once", idempotent=True)
def step_once(ctx: TaskContext, x: int, y: int = 0) -> int:
    """An idempotent ``step_add``: pushed alone, N pushes of one (x, y) run once; as a
    workflow's member it runs under the id its workflow froze (docs/workflows.md)."""
    _record(f"step:{ctx.task_id}", ctx)
    _redis().rpush(f"demo:once:{x}:{y}", ctx.task_id)
    return x + y


@rl_task(name="demo.step_sum")
def step_sum(ctx: TaskContext, values: list[int], start: int = 0) -> int:
    """A chord callback: ``start + sum(values)``, recorded as ``demo.step_add`` records."""
    _record(f"step:{ctx.task_id}", ctx)
    _redis().rpush(f"demo:step-x:{ctx.task_id}", json.dumps(values))
    return start + sum(values)


# --- Celery's own canvas, the contender of the chaos runner's workflows scenario --------
# Plain Celery tasks run as a careful Celery user runs them: acknowledged after the run
# (acks_late), given back when their pool process dies (reject_on_worker_lost), results
# kept (a chord needs its members' results). Each run is recorded as demo.step_add
# records its own: a start (pool process and worker) and, once the body is done, its
# result; and while it runs its pool process maps to it, so the runner can kill it.


def _plain_run(request: Any, x: Any, result: int, sleep_s: float) -> int:
    client, pid = _redis(), os.getpid()
    client.rpush(f"demo:plain-exec:{request.id}", f"{pid}:{request.hostname}")
    client.rpush(f"demo:plain-x:{request.id}", json.dumps(x))
    client.hset("demo:plain-running", str(pid), request.id)
    if sleep_s:
        time.sleep(sleep_s)
    client.hdel("demo:plain-running", str(pid))
    client.rpush(f"demo:plain-done:{request.id}", json.dumps(result))
    return result


_PLAIN_CANVAS = {"acks_late": True, "reject_on_worker_lost": True, "ignore_result": False}


@shared_task(name="demo.plain_add", bind=True, **_PLAIN_CANVAS)
def plain_add(self: Any, x: int, y: int = 0, sleep_s: float = 0.0) -> int:
    """``demo.step_add`` as a plain Celery task: ``x + y``."""
    return _plain_run(self.request, x, x + y, sleep_s)


@shared_task(name="demo.plain_sum", bind=True, **_PLAIN_CANVAS)
def plain_sum(self: Any, values: list[int], start: int = 0) -> int:
    """``demo.step_sum`` as a plain Celery task (a chord callback): ``start + sum(values)``."""
    return _plain_run(self.request, values, start + sum(values), 0.0)


@rl_task(name="demo.in_order")
def in_order(line: str, label: str) -> str:
    """Appends ``label`` to ``demo:order:<line>``: the order a worker ran a backlog in
    (tests/integration/celery_compat/test_priorities.py)."""
    _redis().rpush(f"demo:order:{line}", label)
    return label


@rl_task(name="demo.urgent", priority=9)
def urgent(line: str, label: str) -> str:
    """``in_order`` with a default priority of 9: taken before the rest."""
    _redis().rpush(f"demo:order:{line}", label)
    return label


@rl_task(name="demo.own_priority", bind=True, priority=3)
def own_priority(self: TaskContext) -> int | None:
    """Its incarnation's priority, as Celery's ``self.request.priority`` reads it."""
    return self.request.priority
