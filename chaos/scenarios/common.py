"""Helpers shared by the scenarios: supervising kills, pausing a zombie, a steady run
with faults at intervals, and judging stale incarnations."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testproject.harness import CeleryWorker

from ..evidence import ZOMBIE_REFUSALS, Evidence, read_logs, read_outcomes
from ..invariants import Check
from ..runner import Item, Run

Running = dict[str, tuple[int, int]]  # task id -> (pool process PID, fence)


def busy_worker(run: Run, timeout_s: float = 15) -> tuple[CeleryWorker, Running] | None:
    """A live worker (seeded choice) with at least one task running, and those tasks,
    or None if none runs anything in time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers = run.cluster.live_workers()
        run.rng.shuffle(workers)
        states = run.task_states()
        for worker in workers:
            running = {
                task_id: (int(s["worker"].rsplit(":", 1)[1]), int(s["fence"]))
                for task_id, s in states.items()
                if s["state"] == "running" and s["worker"].startswith(f"{worker.hostname}:")
            }
            if running:
                return worker, running
        time.sleep(0.05)
    return None


def kill_child(run: Run, worker: CeleryWorker, running: Running) -> Running:
    """SIGKILL one pool process of ``worker`` that runs a task (seeded choice); returns
    the tasks it interrupted (empty if none of them runs in a child of ``worker``)."""
    children = {p.pid for p in worker.children()}
    pids = sorted({pid for pid, _ in running.values()} & children)
    if not pids:
        return {}
    pid = run.rng.choice(pids)
    os.kill(pid, signal.SIGKILL)
    hit = {t: v for t, v in running.items() if v[0] == pid}
    run.fault(f"SIGKILL pool process {pid} of {worker.name} (running {len(hit)} task)", pids=[pid])
    return hit


def kill_worker(run: Run, worker: CeleryWorker, running: Running) -> CeleryWorker:
    """SIGKILL ``worker`` whole (main process and pool), then restart its slot, as a
    supervisor (systemd, Kubernetes) would."""
    slot = run.cluster.slot_of(worker)
    children = [p.pid for p in worker.children()]
    pid = worker.pid
    worker.kill()
    run.fault(
        f"SIGKILL worker {worker.name} (main {pid} + {len(children)} pool processes; "
        f"{len(running)} task(s) marked running there, and its prefetched ones)",
        pids=[pid, *children],
    )
    fresh = run.cluster.replace(slot)
    run.fault(f"supervisor: {worker.name} replaced by {fresh.name}", interrupts=False)
    return fresh


def interrupted_checks(hits: dict[str, int], planned: int, kinds: Counter):  # type: ignore[no-untyped-def]
    """``hits``: task id -> the fence it ran at when its process was killed. Each must
    have been resurrected (committed at a higher fence), unless that run had already
    reached its end before the kill (then its own commit may have won the race).

    A journaled ``end`` at that fence proves the run finished before the kill: a
    SIGKILLed process writes nothing afterwards, and one fence starts only once. Its
    timestamp is not compared with the runner's clock reading taken before the kill,
    since the task can finish between that reading and the signal."""

    def verify(ev: Evidence) -> list[Check]:
        bad = []
        resurrected = 0
        for task_id, fence in hits.items():
            commits = [e.fence for e in ev.events_of(task_id, "committed")]
            result = (ev.outcomes.get(task_id) or {}).get("result") or {}
            final = commits[-1] if commits else result.get("fence")
            if final is not None and final > fence:
                resurrected += 1
                continue
            finished = any(e.fence == fence for e in ev.executions_of(task_id, "end"))
            if not finished:
                bad.append(task_id)
        done = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"
        return [
            Check(
                "the kills hit processes that were running tasks",
                sum(kinds.values()) == planned and bool(hits),
                f"{sum(kinds.values())}/{planned} kills ({done}); {len(hits)} task(s) interrupted",
            ),
            Check(
                "each interrupted task was resurrected and committed at a higher fence",
                not bad,
                f"{resurrected}/{len(hits)} resurrected; the rest had finished before the kill"
                + (f"; not resurrected: {', '.join(bad[:3])}" if bad else ""),
            ),
        ]

    return verify


def wait_superseded(run: Run, held: dict[str, int], timeout_s: float = 90) -> bool:
    """Until every task in ``held`` (id -> fence) has moved past that fence and has an
    outcome: it was resurrected and finished elsewhere."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        outcomes = read_outcomes(run.client, list(held))
        states = run.task_states(list(held))
        moved = all(
            outcomes[t] is not None or int(states.get(t, {}).get("fence", 0)) > f
            for t, f in held.items()
        )
        if moved and all(o is not None for o in outcomes.values()):
            return True
        time.sleep(0.1)
    return False


def wait_refusals(log: Path, held: dict[str, int], timeout_s: float = 30) -> bool:
    """Until ``log`` shows a refusal of every (task, fence) in ``held``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen = {(e.task_id, e.fence) for e in read_logs([log]) if e.kind in ZOMBIE_REFUSALS}
        if all((t, f) in seen for t, f in held.items()):
            return True
        time.sleep(0.2)
    return False


def stale_incarnation_checks(held: dict[str, int], log_name: str, who: str):  # type: ignore[no-untyped-def]
    """Checks that the incarnations ``held`` by a paused or cut-off worker never
    committed once they came back, and that each one was refused, in its own log."""

    def verify(ev: Evidence) -> list[Check]:
        committed = {(e.task_id, e.fence): e.source for e in ev.log_events if e.kind == "committed"}
        stale_commits = [t for t, f in held.items() if (t, f) in committed]

        def committed_later(task_id: str, fence: int) -> bool:
            if any(
                e.fence is not None and e.fence > fence for e in ev.events_of(task_id, "committed")
            ):
                return True
            outcome = ev.outcomes.get(task_id) or {}
            result = outcome.get("result") if outcome.get("status") == "ok" else None
            return isinstance(result, dict) and int(result.get("fence", 0)) > fence

        later = [t for t, f in held.items() if committed_later(t, f)]
        refusals = Counter(
            e.kind
            for e in ev.log_events
            if e.source == log_name and e.kind in ZOMBIE_REFUSALS and held.get(e.task_id) == e.fence
        )
        refused_ids = {
            e.task_id
            for e in ev.log_events
            if e.source == log_name and e.kind in ZOMBIE_REFUSALS and held.get(e.task_id) == e.fence
        }
        ran_on = sum(
            1 for t, f in held.items() if any(x.fence == f for x in ev.executions_of(t, "end"))
        )
        kinds = ", ".join(f"{k} x{n}" for k, n in sorted(refusals.items())) or "none"
        return [
            Check(
                f"{who} held running tasks when the fault hit",
                bool(held),
                f"{len(held)} task(s)",
            ),
            Check(
                "each was resurrected and committed at a higher fence by another incarnation",
                len(later) == len(held),
                f"{len(later)}/{len(held)}",
            ),
            Check(
                f"the stale incarnations on {who} committed nothing",
                not stale_commits,
                f"{len(stale_commits)} stale commit(s)"
                + (f": {', '.join(stale_commits[:5])}" if stale_commits else ""),
            ),
            Check(
                f"{who} refused each stale incarnation itself (its log)",
                len(refused_ids) == len(held),
                f"{len(refused_ids)}/{len(held)}: {kinds}; {ran_on} stale run(s) reached "
                "their end (executions may be 2, commits never)",
            ),
        ]

    return verify


def kill_busy(run: Run, kind: str) -> tuple[str, dict[str, int]] | None:
    """SIGKILL a busy pool process (``child``) or a whole worker; the kind done and the
    tasks it interrupted (task id -> fence), or None if nothing was running."""
    found = busy_worker(run)
    if found is None:
        run.note(f"{kind} kill: no task was running any more; skipped")
        return None
    worker, running = found
    hit = kill_child(run, worker, running) if kind == "child" else {}
    if not hit:  # a worker kill, or no pool process of that worker ran a task after all
        kill_worker(run, worker, running)
        hit, kind = running, "worker"
    return kind, {task_id: fence for task_id, (_, fence) in hit.items()}


def pause_zombie(run: Run) -> tuple[dict[str, int], str]:
    """SIGSTOP one pool process running a task, past the heartbeat TTL, until its tasks
    were resurrected and committed elsewhere; then SIGCONT it. Returns what it held
    (task id -> fence) and its worker's log, where it must refuse each one."""
    for _attempt in range(5):
        found = busy_worker(run)
        if found is None:
            break
        worker, running = found
        pids = sorted({pid for pid, _ in running.values()} & {p.pid for p in worker.children()})
        if not pids:
            continue
        pid = run.rng.choice(pids)
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:  # it exited between the store naming it and the signal
            continue
        # A stopped process writes nothing more: what the store says now is all it holds.
        holder = f"{worker.hostname}:{pid}"
        held = {
            task_id: int(s["fence"])
            for task_id, s in run.task_states().items()
            if s["state"] == "running" and s["worker"] == holder
        }
        if held:
            _await_zombie(run, worker, pid, held)
            return held, worker.log_path.name
        os.kill(pid, signal.SIGCONT)
    run.note("zombie: no pool process was running a task to pause")
    return {}, ""


def _await_zombie(run: Run, worker: CeleryWorker, pid: int, held: dict[str, int]) -> None:
    paused_at = time.time()
    run.fault(
        f"SIGSTOP pool process {pid} of {worker.name} holding {len(held)} running task",
        pids=[pid],
    )
    if not wait_superseded(run, held):
        run.note("zombie: its tasks were not all resurrected and committed within 90 s")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
    run.fault(
        f"SIGCONT pool process {pid} after {time.time() - paused_at:.1f} s: a zombie now",
        interrupts=False,
    )
    wait_refusals(worker.log_path, held)


@dataclass
class Faulted:
    """What a :func:`faulted_run` did: the tasks its kills interrupted (task id ->
    fence) and the kinds of kill, what the zombie held and its worker's log, and the
    server faults' own results, in order."""

    hits: dict[str, int] = field(default_factory=dict)
    kinds: Counter[str] = field(default_factory=Counter)
    held: dict[str, int] = field(default_factory=dict)
    zombie_log: str = ""
    server: list[Any] = field(default_factory=list)

    def verify(self, run: Run, steps: list[str]) -> None:
        """The kills' and the zombie's checks."""
        kills = sum(1 for s in steps if s in ("child", "worker"))
        run.verify(interrupted_checks(self.hits, kills, self.kinds))
        run.verify(stale_incarnation_checks(self.held, self.zombie_log, "the paused pool process"))


def faulted_run(
    run: Run,
    steps: list[str],
    server_steps: Collection[str],
    burst: int,
    work_s: tuple[float, float],
    burst_work_s: tuple[float, float],
    pace: float,
    min_span_s: float,
    on_server: Callable[[str, list[Item]], Any],
) -> Faulted:
    """A steady producer at ``pace`` of what the workers can run (over at least
    ``min_span_s``), and ``steps`` at even intervals through it: ``child`` and
    ``worker`` kills, a ``zombie``, and the server faults (``server_steps``), each of
    which gets a burst of ``burst`` longer tasks to go down holding."""
    faults = sum(1 for s in steps if s in server_steps)
    steady = run.items(run.n - burst * faults, work_s)
    bursts = run.items(burst * faults, burst_work_s, prefix="burst-")
    processes = max(1, len(run.cluster.live_workers())) * run.cluster.concurrency
    over_s = max(min_span_s, len(steady) * sum(work_s) / 2 / processes / pace)
    run.produce(steady, over_s=over_s)
    began, gap = time.monotonic(), over_s / (len(steps) + 1)
    done = Faulted()
    for k, step in enumerate(steps):
        time.sleep(max(0.0, began + gap * (k + 1) * run.rng.uniform(0.8, 1.2) - time.monotonic()))
        if step in server_steps:
            done.server.append(on_server(step, bursts[:burst]))
            bursts = bursts[burst:]
        elif step == "zombie":
            done.held, done.zombie_log = pause_zombie(run)
        elif (hit := kill_busy(run, step)) is not None:
            done.kinds[f"{hit[0]} kill(s)"] += 1
            done.hits.update(hit[1])
    return done
