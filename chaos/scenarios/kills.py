"""Faults on worker processes: SIGKILL, SIGSTOP (zombie), SIGTERM (deploys), poison."""

from __future__ import annotations

import threading
import time
from collections import Counter

from testproject.harness import CeleryWorker

from ..evidence import Evidence
from ..invariants import Check
from ..report import recovery_latencies
from ..runner import Item, Run
from . import Scenario
from .common import (
    busy_worker,
    interrupted_checks,
    kill_child,
    kill_worker,
    stale_incarnation_checks,
    wait_refusals,
    wait_superseded,
)

MEAN_WORK_S = 0.5


def _processes(run: Run) -> int:
    return max(1, len(run.cluster.live_workers())) * run.cluster.concurrency


# -- worker-kill ------------------------------------------------------------------------------
def worker_kill(run: Run) -> None:
    run.start()
    expected_s = run.n * MEAN_WORK_S / _processes(run)
    run.produce(run.items(run.n, (0.2, 0.8)), over_s=expected_s * 0.6)
    planned = max(2, run.n // 50)
    hits: dict[str, int] = {}
    kinds: Counter[str] = Counter()
    for k in range(planned):
        time.sleep(run.rng.uniform(0.5, 1.5) * expected_s / (planned + 1))
        kind = ("child", "worker")[k] if k < 2 else run.rng.choice(("child", "worker"))
        found = busy_worker(run)
        if found is None:
            run.note(f"kill {k + 1}: no task was running any more; skipped")
            continue
        worker, running = found
        hit = kill_child(run, worker, running) if kind == "child" else {}
        if not hit:
            kill_worker(run, worker, running)
            hit, kind = running, "worker"
        kinds[f"{kind} kill(s)"] += 1
        hits.update({t: fence for t, (_, fence) in hit.items()})
    run.verify(interrupted_checks(hits, planned, kinds))


# The queued grace keeps its default (an hour): a message a worker takes is marked held
# by it in the same step (take.lua), so a worker SIGKILLed with a take in flight leaves
# its task to the death check, not to the grace (docs/architecture.md, a pop that leaves
# a trace). Before, this scenario shortened the grace to bring such a task back.
WORKER_KILL = Scenario(
    "worker-kill",
    "random SIGKILLs of pool processes and whole workers; a supervisor restarts them",
    worker_kill,
)


# -- zombie -----------------------------------------------------------------------------------
def zombie(run: Run) -> None:
    run.start(workers=max(2, run.opts.workers))  # someone must be left to resurrect onto
    run.push_all(run.items(run.n, (0.3, 1.2)))
    held: dict[str, int] = {}
    victim = None
    for _attempt in range(5):
        found = busy_worker(run)
        if found is None:
            break
        victim = found[0]
        victim.stop_group()
        # The paused processes can write nothing more: what the hash says now is
        # exactly what the zombie holds.
        held = run.running_on(victim.hostname)
        if held:
            break
        victim.cont_group()
    if victim is None or not held:
        run.note("zombie: no worker was running a task to pause")
        run.verify(stale_incarnation_checks({}, "", "the paused worker"))
        return
    paused_at = time.time()
    run.fault(
        f"SIGSTOP worker {victim.name} (main + pool) holding {len(held)} running task(s)",
        pids=[victim.pid, *(p.pid for p in victim.children())],
    )
    if not wait_superseded(run, held):
        run.note("zombie: its tasks were not all resurrected and committed within 90 s")
    victim.cont_group()
    run.fault(
        f"SIGCONT {victim.name} after {time.time() - paused_at:.1f} s: its "
        f"{len(held)} incarnation(s) are zombies now",
        interrupts=False,
    )
    wait_refusals(victim.log_path, held)
    run.verify(stale_incarnation_checks(held, victim.log_path.name, "the paused worker"))


ZOMBIE = Scenario(
    "zombie",
    "SIGSTOP a worker past the heartbeat TTL, let its tasks be resurrected, SIGCONT it",
    zombie,
)


# -- graceful-deploy --------------------------------------------------------------------------
DEPLOY_TTL_S = 10.0


def _await_exit(worker: CeleryWorker, sent: float, exits: dict) -> None:  # type: ignore[type-arg]
    try:
        code = worker.process.wait(90) if worker.process else None
    except Exception:  # still draining after 90 s: a failed deploy
        code = None
        worker.kill()
    exits[worker.name] = (code, time.time() - sent)


def graceful_deploy(run: Run) -> None:
    run.start()
    longs = max(2, run.n // 20)
    items = run.items(run.n - longs, (0.1, 0.5)) + run.items(longs, (4.0, 6.0), prefix="long-")
    run.rng.shuffle(items)
    slots = list(run.cluster.slots)
    over_s = max(4.0, run.n * 0.3 / _processes(run))
    run.produce(items, over_s=over_s)
    # As a Deployment rolls: once a replacement is ready its predecessor gets SIGTERM,
    # and the next one rolls without waiting for that warm shutdown to end.
    exits: dict[str, tuple[int | None, float]] = {}
    waiters = []
    for slot in slots:
        time.sleep(run.rng.uniform(0.5, 1.0) * over_s / (len(slots) + 1))
        old = run.cluster.slots[slot]
        if busy_worker(run, 5) is None:
            run.note(f"deploy: nothing was running when {old.name} was rolled")
        fresh = run.cluster.start_worker(slot)  # surge: the replacement is up first
        took = [old.pid, *(p.pid for p in old.children())]
        old.terminate(wait_s=None)  # SIGTERM to the main process only, as Kubernetes does
        run.fault(
            f"SIGTERM main process {old.pid} of {old.name} (rolling; {fresh.name} is up)",
            pids=took,
        )
        waiter = threading.Thread(target=_await_exit, args=(old, time.time(), exits), daemon=True)
        waiter.start()
        waiters.append(waiter)
    for waiter in waiters:
        waiter.join(120)

    def verify(ev: Evidence) -> list[Check]:
        lat = recovery_latencies(ev.executions, run.report.faults)
        handoffs = sum(
            1 for p in run.cluster.log_paths() if "handed off" in p.read_text(errors="replace")
        )
        return [
            Check(
                "every SIGTERMed worker finished its warm shutdown and exited 0",
                all(code == 0 for code, _ in exits.values()),
                ", ".join(f"{n}: exit {c} after {s:.1f} s" for n, (c, s) in exits.items()),
            ),
            Check(  # else the scenario proved nothing about hand-off
                "a SIGTERMed worker handed tasks off (long tasks were running at a SIGTERM)",
                handoffs >= 1,
                f"hand-off lines in {handoffs} log(s)",
            ),
            Check(
                "handed-off tasks restarted well within one TTL (no TTL wait)",
                not lat or max(lat) < DEPLOY_TTL_S,
                (f"max {max(lat):.2f} s" if lat else "no hand-off needed")
                + f" < TTL {DEPLOY_TTL_S:g} s; hand-off lines in {handoffs} log(s)",
            ),
        ]

    run.verify(verify)


GRACEFUL_DEPLOY = Scenario(
    "graceful-deploy",
    "rolling SIGTERM of every worker's main process, each replaced by a fresh worker",
    graceful_deploy,
    env={"RELIER_HEARTBEAT_TTL_S": str(DEPLOY_TTL_S), "RELIER_DRAIN_TIMEOUT_S": "2"},
)


# -- poison -----------------------------------------------------------------------------------
def poison(run: Run) -> None:
    from testproject.demo import tasks

    run.start()
    count = max(1, min(10, run.n // 20))
    items = run.items(run.n - count, (0.1, 0.4)) + [
        Item(tasks.chaos_poison, f"poison-{i}", {"journal": str(run.journal)}, "resurrection_limit")
        for i in range(count)
    ]
    run.rng.shuffle(items)
    run.push_all(items)
    limit = tasks.chaos_poison.relier_spec.max_resurrections
    poisoned = {p.task_id for p in run.pushed.values() if p.task == tasks.chaos_poison.name}

    def verify(ev: Evidence) -> list[Check]:
        wanted = list(range(1, limit + 2))
        wrong = [
            t for t in poisoned if sorted(e.fence for e in ev.executions_of(t, "start")) != wanted
        ]
        others = [t for t in run.pushed if t not in poisoned]
        again = sum(1 for t in others if len(ev.executions_of(t, "start")) > 1)
        return [
            Check(
                f"each poison task ran {limit + 1} times (fences {wanted}), then the DLQ",
                not wrong,
                f"{len(poisoned) - len(wrong)}/{len(poisoned)}"
                + (f"; wrong: {', '.join(wrong[:3])}" if wrong else ""),
            ),
            Check(
                "the other tasks were unaffected (each committed once)",
                all((ev.outcomes.get(t) or {}).get("status") == "ok" for t in others),
                f"{len(others)} tasks; {again} of them started more than once",
            ),
        ]

    run.verify(verify)
    run.note(
        f"poison: {count} task(s) SIGKILL their own pool process on every run "
        f"(max_resurrections={limit})"
    )


POISON = Scenario(
    "poison",
    "a task that SIGKILLs its own pool process every time: DLQ after max_resurrections",
    poison,
)
