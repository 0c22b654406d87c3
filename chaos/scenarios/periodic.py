"""A periodic entry fired by three schedulers at once while the scanner leader is
SIGKILLed and restarted (G11: each tick fires exactly once, whoever fires it).

The entry is ``chaos-periodic`` (``testproject/settings.py``, from the environment):
``demo.chaos_scheduled`` every second, so each run journals its start and end (the
shared invariants), its tick as ``ctx.scheduled_at`` and its start on the Redis clock.
The schedulers are the workers' embedded scanners and ``manage.py
relier_resurrector``; each one calls ``fire_due`` every pass, the leader at the tick.
The leader is read from ``<p>:resurrector:leader`` (``host:pid`` of its process) and
killed whole (a worker's main process and pool, or the resurrector) at a whole second,
when it fires its tick, then restarted as a supervisor would.

At the end of the window the scanners that know the entry are stopped (SIGTERM) and
workers without it drain what is left, so the ticks stop at a known last one: the
entry's recorded tick in ``<p>:periodic``. The ticks are every whole second from the
first one after the entry was first seen (the seed a scanner records) to that last
one; each tick's task id is ``periodic.tick_id(entry, tick)``, and each is checked as a
pushed task (committed once), plus: none missing, none run twice (bar a re-run of a
run its worker's death interrupted, at a higher fence), none early on the Redis clock,
nothing fired outside those ticks.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import redis

from testproject.harness import CeleryWorker

from ..evidence import KEYS, Evidence, Pushed
from ..invariants import Check
from ..report import percentile
from ..runner import Options, Run
from . import Scenario

ENTRY = "chaos-periodic"
TASK = "demo.chaos_scheduled"
EVERY_MS = 1000
WORK_S = 0.3
# A leader killed between tick.lua and tick_done.lua leaves its claim to run out before
# another scanner takes the tick over; the default lease (30 s) would only make the run
# longer (and the report's lateness with it).
LEASE_S = "2"
OUTSIDE = 10  # ticks checked on either side of the range: none may have fired


def duration_s(opts: Options) -> float:
    """How long the entry ticks: 18 s small (20 tasks), 2 minutes at full size (500)."""
    return float(min(120, max(18, round(opts.tasks * 0.24))))


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%H:%M:%S.%f")[:-3]


@dataclass
class Watch:
    """Polls the entry's recorded tick and the leader key from a thread of its own
    (a client of its own), from before any scanner starts: the first value it sees is
    the seed that the first scanner records."""

    run: Run
    first: int | None = None  # the first value of <p>:periodic[ENTRY] seen
    leaders: list[tuple[float, str | None]] = field(default_factory=list)  # (at, holder)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        assert self.run.cluster.redis is not None
        self._client = self.run.cluster.redis.client(decode_responses=True)
        self._thread = threading.Thread(target=self._loop, name="chaos-watch", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        holder: str | None = "-"
        while not self._stop.is_set():
            try:
                last, now = self._client.hget(KEYS.periodic, ENTRY), self._client.get(KEYS.leader)
            except redis.exceptions.RedisError:
                time.sleep(0.05)
                continue
            if last is not None and self.first is None:
                self.first = int(last)
            if now != holder:
                self.leaders.append((time.time(), now))
                holder = now
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._client.close()

    def new_leader_after(self, at: float, old: str) -> float | None:
        """Seconds from ``at`` until the leader key named a scanner other than ``old``."""
        return next((t - at for t, h in self.leaders if t >= at and h and h != old), None)


@dataclass(frozen=True)
class Kill:
    at: float
    who: str  # the victim's name: w1, w1-2, resurrector
    holder: str  # the leader key's value at the kill
    orphan: str | None  # a claim the victim left behind (still there 0.5 s later)


def _leader_process(run: Run) -> tuple[str, object, str] | None:
    """(name, process, holder) of the live scanner that holds the leader lease."""
    holder = run.client.get(KEYS.leader) or ""
    for worker in run.cluster.live_workers():
        if holder == f"{worker.hostname}:{worker.pid}":
            return worker.name, worker, holder
    proc = run.cluster.resurrector
    if proc is not None and proc.poll() is None and holder.endswith(f":{proc.pid}:command"):
        return "resurrector", proc, holder
    return None


def _wait_leader(run: Run, timeout_s: float = 20) -> tuple[str, object, str] | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (found := _leader_process(run)) is not None:
            return found
        time.sleep(0.05)
    return None


def _sleep_until(at: float) -> None:
    time.sleep(max(0.0, at - time.time()))


def _kill_leader(run: Run, kills: list[Kill], at_claim: bool) -> None:
    """SIGKILL the scanner leader (``at_claim``: the instant it claims a tick, else at
    a random instant), then restart it."""
    for _ in range(5):
        found = _wait_leader(run)
        if found is None:
            break
        name, proc, holder = found
        second = int(time.time()) + 1
        if not at_claim:  # anywhere in the second: mostly asleep between ticks
            _sleep_until(second + run.rng.uniform(0.05, 0.95))
            if run.client.get(KEYS.leader) == holder:
                break
            continue  # the lead moved meanwhile (a lease lapse): find it again
        # The leader wakes for each tick at the whole second (the Redis clock is this
        # host's) and claims, pushes and records it within a few ms: kill it the moment
        # a claim appears, between its tick.lua and its tick_done.lua.
        _sleep_until(second - 0.02)
        if run.client.get(KEYS.leader) != holder:
            continue
        until = second + 0.05
        while time.time() < until and not run.client.hget(KEYS.periodic_claims, ENTRY):
            pass
        break
    else:
        found = None
    if found is None:
        run.note("no scanner of ours held the leader lease: a kill was skipped")
        return
    if isinstance(proc, subprocess.Popen):
        pid = proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        proc.wait(10)
        at = time.time()
        run.fault(f"SIGKILL manage.py relier_resurrector {pid}, the scanner leader", pids=[pid])
    else:
        assert isinstance(proc, CeleryWorker)
        children = [p.pid for p in proc.children()]
        pid = proc.pid
        running = len(run.running_on(proc.hostname))
        proc.kill()
        at = time.time()
        run.fault(
            f"SIGKILL worker {name}, the scanner leader (main {pid} + {len(children)} pool "
            f"processes; {running} tick task(s) marked running there, and its prefetched ones)",
            pids=[pid, *children],
        )
    claim = run.client.hget(KEYS.periodic_claims, ENTRY)
    time.sleep(0.5)  # a live scanner holds a claim for milliseconds
    orphan = claim if claim and run.client.hget(KEYS.periodic_claims, ENTRY) == claim else None
    kills.append(Kill(at, name, holder, orphan))
    # The supervisor restarts it.
    if isinstance(proc, subprocess.Popen):
        run.cluster._resurrector_log.close()
        fresh = run.cluster.start_resurrector()
        run.fault(f"supervisor: relier_resurrector restarted (pid {fresh.pid})", interrupts=False)
    else:
        assert isinstance(proc, CeleryWorker)
        slot = run.cluster.slot_of(proc)
        worker = run.cluster.replace(slot)
        run.fault(f"supervisor: {name} replaced by {worker.name}", interrupts=False)


def _stop_periodic_scanners(run: Run, slots: set[str]) -> None:
    """SIGTERM every process that knows the entry (warm shutdowns, in parallel)."""
    threads = [
        threading.Thread(target=run.cluster.slots[s].terminate, daemon=True)
        for s in slots
        if run.cluster.slots[s].alive()
    ]
    for t in threads:
        t.start()
    proc = run.cluster.resurrector
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    for t in threads:
        t.join(60)


def _exists(run: Run, tick: int) -> bool:
    task_id = tick_id(tick)
    return bool(run.client.exists(KEYS.result(task_id), KEYS.task(task_id)))


def tick_id(tick_ms: int) -> str:
    from relier_django.core.schedule import periodic

    return periodic.tick_id(ENTRY, tick_ms)


def _timed_starts(run: Run) -> list[dict]:
    out = []
    for path in sorted(run.journal.glob("sched-*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def periodic_leader_kill(run: Run) -> None:
    # Every process started from here on knows the entry (the drain workers excepted).
    run.cluster.env.update(
        {
            "DEMO_CHAOS_PERIODIC_EVERY_S": str(EVERY_MS / 1000),
            "DEMO_CHAOS_PERIODIC_JOURNAL": str(run.journal),
            "DEMO_CHAOS_PERIODIC_WORK_S": str(WORK_S),
        }
    )
    watch = Watch(run)
    watch.start()
    try:
        run.start()  # the workers (embedded scanners) and manage.py relier_resurrector
        periodic_slots = set(run.cluster.slots)
        deadline = time.monotonic() + 30
        while watch.first is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if watch.first is None:
            raise RuntimeError(f"no scanner recorded the entry {ENTRY!r} within 30 s")
        seed = watch.first
        first = seed if seed % EVERY_MS == 0 and _exists(run, seed) else (seed // 1000 + 1) * 1000
        run.report.started_at = first / 1000  # the first tick: the workload's first push
        window = duration_s(run.opts)
        planned = max(2, int(window // 30))  # 2 small, 4 at full size
        kills: list[Kill] = []
        for k in range(planned):
            at = first / 1000 + window * (k + 1) / (planned + 1) + run.rng.uniform(-1.0, 1.0)
            _sleep_until(at - 1)
            _kill_leader(run, kills, at_claim=k % 2 == 0)
        _sleep_until(first / 1000 + window)
        # Stop the ticks at a known last one: workers without the entry drain what is
        # left, and every process that knows it gets a SIGTERM.
        drain = [
            run.cluster.start_worker_nowait(
                f"d{i + 1}", extra_env={"DEMO_CHAOS_PERIODIC_EVERY_S": "0"}
            )
            for i in range(run.opts.workers)
        ]
        for worker in drain:
            worker.wait_ready(90)
        stopping = time.time()
        _stop_periodic_scanners(run, periodic_slots)
    finally:
        watch.stop()
    last = int(run.client.hget(KEYS.periodic, ENTRY) or 0)
    claim = run.client.hget(KEYS.periodic_claims, ENTRY)
    left_claim = ""
    if claim:  # a scanner stopped between its claim and its record
        claimed = int(claim.split(":", 1)[0])
        pushed = _exists(run, claimed)
        left_claim = f"claim on {_iso(claimed)} left by a stopped scanner, " + (
            "its task pushed: counted" if pushed else "never pushed: not a tick of the run"
        )
        if pushed:
            last = max(last, claimed)
    ticks = list(range(first, last + 1, EVERY_MS))
    with run._lock:
        for tick in ticks:
            task_id = tick_id(tick)
            run.pushed[task_id] = Pushed(task_id, f"tick {_iso(tick)}", TASK, "commit", tick / 1000)
    run.note(
        f"entry {ENTRY!r}: {TASK} every {EVERY_MS / 1000:g} s ({WORK_S} s of work), fired by "
        f"{len(periodic_slots)} worker(s)' embedded scanners and manage.py relier_resurrector "
        f"for {window:.0f} s; the entry was first seen at {_iso(seed)}"
        + (" (a fired tick: the seed was not seen)" if seed == first else "")
        + f"; at +{stopping - first / 1000:.1f} s its scanners got SIGTERM and "
        f"{len(drain)} worker(s) without it drained the rest"
        + (f"; {left_claim}" if left_claim else "")
    )
    run.verify(_checks(run, ticks, kills, planned, watch))


def _checks(run: Run, ticks: list[int], kills: list[Kill], planned: int, watch: Watch):  # type: ignore[no-untyped-def]
    by_id = {tick_id(t): t for t in ticks}

    def verify(ev: Evidence) -> list[Check]:
        first, last = ticks[0], ticks[-1]
        state = int(run.client.hget(KEYS.periodic, ENTRY) or 0)
        claim = run.client.hget(KEYS.periodic_claims, ENTRY)
        # -- none missing
        ran = {e.task_id for e in ev.executions if e.event == "start"}
        missing = [t for t in ticks if tick_id(t) not in ran]
        # -- none doubled: a second start only after the first was interrupted by a kill
        killed = {pid for f in run.report.faults if f.interrupts for pid in f.pids}
        once = rerun = 0
        doubled = []
        for task_id in by_id:
            starts = sorted(ev.executions_of(task_id, "start"), key=lambda e: e.at)
            if len(starts) <= 1:
                once += len(starts)
                continue
            fences = [e.fence for e in starts]
            if len(set(fences)) == len(fences) and all(e.pid in killed for e in starts[:-1]):
                rerun += 1
            else:
                doubled.append(f"{_iso(by_id[task_id])} fences {fences}")
        # -- none early, each saw its own tick
        timed = _timed_starts(run)
        early, wrong, local = [], [], 0
        late: dict[str, float] = {}
        for s in timed:
            tick = by_id.get(s["id"])
            if tick is None:
                continue
            if s["due_ms"] != tick:
                wrong.append(s["id"])
            started = s["redis_ms"]
            if started is None:
                local += 1
                started = s["t"] * 1000
            if started < tick:
                early.append(f"{_iso(tick)} {tick - started:.0f} ms early")
            late[s["id"]] = min(late.get(s["id"], started - tick), started - tick)
        worst_id = max(late, key=lambda i: late[i]) if late else None
        slow = [f"{_iso(by_id[i])} {v / 1000:.1f} s" for i, v in late.items() if v > 1000]
        # -- nothing outside the range
        strays = sorted({s["id"] for s in timed} - set(by_id))
        around = [first - EVERY_MS * i for i in range(1, OUTSIDE + 1)] + [
            last + EVERY_MS * i for i in range(1, OUTSIDE + 1)
        ]
        fired_outside = [_iso(t) for t in around if _exists(run, t)]
        # -- the kills
        failovers = [watch.new_leader_after(k.at, k.holder) for k in kills]
        orphans = [int((k.orphan or "0").split(":", 1)[0]) for k in kills if k.orphan]
        logs = "".join(p.read_text(errors="replace") for p in run.cluster.log_paths())
        takeovers = [
            f"{_iso(t)} "
            + ("found pushed" if f"already pushed task_id={tick_id(t)}" in logs else "pushed")
            + (f", {late[tick_id(t)]:.0f} ms late" if tick_id(t) in late else "")
            for t in orphans
        ]
        lat = list(late.values())
        return [
            Check(
                "every tick from the first to the last fired (none missing)",
                bool(ticks) and not missing,
                f"{len(ticks) - len(missing)}/{len(ticks)} ticks ran, each second from "
                f"{_iso(first)} to {_iso(last)} (the entry's recorded last tick "
                f"{_iso(state)}; claims left: {'1' if claim else 'none'})"
                + (f"; missing: {', '.join(_iso(t) for t in missing[:5])}" if missing else ""),
            ),
            Check(
                "no tick ran twice (bar a re-run, at a higher fence, of a run a kill cut short)",
                not doubled,
                f"{once} ran once, {rerun} ran again after the kill took the process running "
                "it" + (f"; doubled: {', '.join(doubled[:3])}" if doubled else ""),
            ),
            Check(
                "no tick started before its time; each run saw its tick (Redis clock)",
                not early and not wrong and bool(late),
                f"{len(early)} early of {len(timed)} starts; {len(timed) - len(wrong)}/"
                f"{len(timed)} saw their tick as ctx.scheduled_at; lateness of first starts "
                + (
                    f"p50 {percentile(lat, 50):.0f} ms, p99 {percentile(lat, 99):.0f} ms, max "
                    f"{max(lat):.0f} ms (tick {_iso(by_id[worst_id])}, "
                    f"+{by_id[worst_id] / 1000 - run.report.started_at:.1f} s)"
                    if worst_id
                    else "none"
                )
                + (f"; late by more than a second: {', '.join(slow[:5])}" if slow else "")
                + (f"; {local} timed by the local clock" if local else "")
                + (f"; early: {', '.join(early[:3])}" if early else ""),
            ),
            Check(
                "nothing fired outside those ticks",
                not strays and not fired_outside,
                f"{len(strays)} run(s) of other ids; {len(fired_outside)} task(s) among the "
                f"{OUTSIDE} tick ids either side"
                + (f": {', '.join(fired_outside[:3])}" if fired_outside else ""),
            ),
            Check(
                "each kill took the scanner leader, and another scanner took the lead",
                len(kills) == planned and all(f is not None for f in failovers),
                f"{len(kills)}/{planned} kills: "
                + ", ".join(
                    f"{k.who} (new leader after "
                    + (f"{f:.1f} s" if f is not None else "never")
                    + ")"
                    for k, f in zip(kills, failovers, strict=True)
                )
                + f"; {len(orphans)} left its claim, taken over once its lease ({LEASE_S} s) "
                "ran out" + (f": {'; '.join(takeovers)}" if takeovers else ""),
            ),
        ]

    return verify


def _env(opts: Options) -> dict[str, str]:
    # The queued grace at its default: a worker SIGKILLed with a tick's message in hand
    # has it marked held (take.lua), and the death check brings it back.
    return {"RELIER_RESURRECT_LEASE_S": LEASE_S}


PERIODIC_LEADER_KILL = Scenario(
    "periodic-leader-kill",
    "a 1 s periodic entry fired by three schedulers at once while the scanner leader is "
    "SIGKILLed and restarted",
    periodic_leader_kill,
    env=_env,
)
