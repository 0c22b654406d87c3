"""Too much work at once (admission control) and work that takes too long (timeouts)."""

from __future__ import annotations

import math
import random
import threading
import time
from dataclasses import dataclass, field

from ..evidence import KEYS, Evidence
from ..invariants import Check
from ..runner import Item, Options, Run
from . import Scenario

# -- load-spike -------------------------------------------------------------------------------
PRODUCERS = 32


def _limit(opts: Options) -> int:
    """Pushes admitted per second: the spike is ``tasks`` at once, ~10 s worth at most."""
    return max(5, min(50, opts.tasks // 10))


@dataclass
class SpikeStats:
    attempts: int = 0
    retry_after_s: list[float] = field(default_factory=list)
    half_stored: list[str] = field(default_factory=list)  # rejected, yet a key was left
    admitted_at: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _leftovers(client, task_id: str) -> bool:
    keys = [KEYS.task(task_id), KEYS.history(task_id), KEYS.result(task_id)]
    return bool(client.exists(*keys)) or client.zscore(KEYS.expiry, task_id) is not None


def _producer(run: Run, items: list[Item], stats: SpikeStats, seed: str, start) -> None:  # type: ignore[no-untyped-def]
    import uuid

    from relier_django.core.model.errors import AdmissionRejected

    rng = random.Random(seed)
    client = run.client
    start.wait()
    for item in items:
        task_id = uuid.uuid4().hex
        while True:
            with stats.lock:
                stats.attempts += 1
            try:
                run.push(item, task_id=task_id)
            except AdmissionRejected as exc:
                leftover = _leftovers(client, task_id)
                with stats.lock:
                    stats.retry_after_s.append(exc.retry_after_s)
                    if leftover:
                        stats.half_stored.append(task_id)
                # A well-behaved client: wait what Retry-After says, plus a little jitter.
                time.sleep(max(exc.retry_after_s, 0.0) + rng.uniform(0, 0.05))
                continue
            except Exception as exc:
                with stats.lock:
                    stats.errors.append(f"{type(exc).__name__}: {exc}")
                break
            with stats.lock:
                stats.admitted_at.append(time.time())
            break


def load_spike(run: Run) -> None:
    limit = _limit(run.opts)
    run.start()
    items = run.items(run.n, (0.01, 0.05))
    stats = SpikeStats()
    start = threading.Event()
    threads = [
        threading.Thread(
            target=_producer,
            args=(run, items[i::PRODUCERS], stats, f"{run.opts.seed}:{i}", start),
            daemon=True,
        )
        for i in range(PRODUCERS)
    ]
    for t in threads:
        t.start()
    run._producers.extend(threads)  # quiescence waits for them, even past the join below
    run.fault(
        f"spike: {PRODUCERS} producers push {run.n} tasks at once against "
        f"ADMISSION_LIMIT={limit}/s",
        interrupts=False,
    )
    began = time.time()
    start.set()
    for t in threads:
        t.join(run.n / limit * 4 + 60)
    took = time.time() - began
    run.note(
        f"spike: {stats.attempts} push attempts in {took:.1f} s for {run.n} tasks "
        f"({stats.attempts / max(took, 0.001):.0f}/s offered against {limit}/s); "
        f"{len(stats.retry_after_s)} refused with Retry-After"
    )
    run.verify(_spike_checks(run, stats, limit))


def _spike_checks(run: Run, stats: SpikeStats, limit: int):  # type: ignore[no-untyped-def]
    def verify(ev: Evidence) -> list[Check]:
        waits = stats.retry_after_s
        admitted = sorted(stats.admitted_at)
        span = admitted[-1] - admitted[0] if admitted else 0.0
        bound = limit * (math.ceil(span) + 1)  # fixed 1 s windows: at most limit in each
        runs = {t: len(ev.executions_of(t, "start")) for t in ev.pushed}
        return [
            Check(
                "the spike was refused: far more attempts than the limit",
                bool(waits),
                f"{len(waits)} refusals of {stats.attempts} attempts",
            ),
            Check(
                "every refusal carried a Retry-After within the window",
                all(0 < w <= 1.0 for w in waits),
                (f"{min(waits):.3f}..{max(waits):.3f} s" if waits else "none")
                + (f"; errors: {stats.errors[:2]}" if stats.errors else ""),
            ),
            Check(
                "a refused push left nothing behind (no task, history, result, index entry)",
                not stats.half_stored,
                f"{len(stats.half_stored)} half-stored",
            ),
            Check(
                "producers that waited Retry-After got every task in",
                len(ev.pushed) == run.n and not stats.errors,
                f"{len(ev.pushed)}/{run.n} admitted",
            ),
            Check(
                "admissions never beat the limit",
                len(admitted) <= bound,
                f"{len(admitted)} admitted over {span:.1f} s <= {bound} ({limit}/s windows)",
            ),
            Check(
                "every admitted push ran exactly once",
                all(n == 1 for n in runs.values()),
                f"{sum(1 for n in runs.values() if n == 1)}/{len(runs)}",
            ),
        ]

    return verify


LOAD_SPIKE = Scenario(
    "load-spike",
    "many producers push far above RELIER_ADMISSION_LIMIT and retry after Retry-After",
    load_spike,
    env=lambda opts: {"RELIER_ADMISSION_LIMIT": f"{_limit(opts)}/s"},
)


# -- slow-task --------------------------------------------------------------------------------
STEPS, STEP_S = 30, 0.1  # 3 s of steps against chaos_slow's hard timeout of 1.5 s


def slow_task(run: Run) -> None:
    from testproject.demo import tasks

    run.start()
    count = max(2, run.n // 10)
    items = run.items(run.n - count, (0.05, 0.3)) + [
        Item(
            tasks.chaos_slow,
            f"slow-{i}",
            {"journal": str(run.journal), "steps": STEPS, "step_s": STEP_S},
            "hard_timeout",
        )
        for i in range(count)
    ]
    run.rng.shuffle(items)
    run.push_all(items)
    spec = tasks.chaos_slow.relier_spec
    slow = {p.task_id for p in run.pushed.values() if p.task == tasks.chaos_slow.name}

    def verify(ev: Evidence) -> list[Check]:
        with_checkpoint = [
            t
            for t in slow
            if (entry := ev.dlq.get(t)) is not None
            and isinstance(entry.checkpoint, dict)
            and entry.checkpoint.get("step", -1) >= 1
        ]
        once = [
            t
            for t in slow
            if len(ev.executions_of(t, "start")) == 1 and not ev.executions_of(t, "end")
        ]
        soft_once = [t for t in slow if len(ev.executions_of(t, "soft")) == 1]
        steps = sorted(ev.dlq[t].checkpoint["step"] for t in with_checkpoint)
        return [
            Check(
                f"each slow task was stopped at its hard timeout ({spec.hard_timeout_s:g} s) "
                "and kept its checkpoint",
                len(with_checkpoint) == len(slow),
                f"{len(with_checkpoint)}/{len(slow)}"
                + (f"; checkpointed steps {steps[0]}..{steps[-1]} of {STEPS}" if steps else ""),
            ),
            Check(
                "it ran once: not retried, not resurrected, never reached its end",
                len(once) == len(slow),
                f"{len(once)}/{len(slow)}",
            ),
            Check(
                f"its soft-timeout hook ran once ({spec.soft_timeout_s:g} s)",
                len(soft_once) == len(slow),
                f"{len(soft_once)}/{len(slow)}",
            ),
        ]

    run.verify(verify)


SLOW_TASK = Scenario(
    "slow-task",
    "tasks that outrun their hard timeout: DLQ with hard_timeout and their checkpoint",
    slow_task,
)
