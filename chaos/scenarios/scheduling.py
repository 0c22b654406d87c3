"""Faults while tasks wait in the schedule index: SIGKILLed workers (the scanner leader
among them), and a Redis restart from its AOF.

The workload is ``demo.chaos_scheduled``, pushed with countdowns spread over the first
seconds of the run. Each start journals, beside the usual record, its due time (what
``push.lua`` set, as ``ctx.scheduled_at`` gives it) and its start on the Redis clock
(``TIME``). Besides the shared invariants (each task committed once, nothing lost,
nothing leaked), each scenario checks that no start came before its due time, and that
the due time each start saw is the one its push asked for: between the Redis clock read
just before the push and just after it, plus the countdown.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from ..evidence import KEYS, Evidence
from ..invariants import Check
from ..report import percentile
from ..runner import Item, Options, Run
from . import Scenario
from .common import kill_worker
from .redis_faults import PUBLISH_RETRY, QUEUED_GRACE_S, fsync_always

WORK_S = (0.1, 0.4)
# A leader killed between schedule_take.lua and schedule_sent.lua leaves its lease to
# run out before the resurrector re-dispatches the task; the default (30 s) would only
# make the run longer.
LEASE_ENV = {"RELIER_RESURRECT_LEASE_S": "2"}


def _horizon_s(opts: Options) -> float:
    """Countdowns are spread over 1 s to this: about 5 s small, 34 s at full size."""
    return round(4 + opts.tasks * 0.06, 1)


def _now_ms(run: Run) -> int:
    seconds, micros = run.client.time()
    return int(seconds) * 1000 + int(micros) // 1000


@dataclass(frozen=True)
class Asked:
    """What a push asked for: due ``countdown_ms`` after a push made between the Redis
    clock readings ``before_ms`` and ``after_ms``."""

    countdown_ms: int
    before_ms: int
    after_ms: int


def push_scheduled(run: Run) -> dict[str, Asked]:
    """Push the workload, each task with a seeded countdown of 1 s to the horizon."""
    from testproject.demo import tasks

    asked = {}
    horizon = _horizon_s(run.opts)
    for i in range(run.n):
        work = round(run.rng.uniform(*WORK_S), 3)
        countdown_ms = int(run.rng.uniform(1.0, horizon) * 1000)
        item = Item(
            tasks.chaos_scheduled, f"{run.name}-{i}", {"journal": str(run.journal), "work_s": work}
        )
        before = _now_ms(run)
        pushed = run.push(item, countdown_s=countdown_ms / 1000)
        asked[pushed.task_id] = Asked(countdown_ms, before, _now_ms(run))
    return asked


def _timed_starts(run: Run) -> list[dict]:
    out = []
    for path in sorted(run.journal.glob("sched-*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # one write(2) per line: cannot happen; never trusted though
    return out


def _lateness(values_s: list[float]) -> str:
    if not values_s:
        return "none"
    ms = [v * 1000 for v in values_s]
    return f"p50 {percentile(ms, 50):.0f} ms, p99 {percentile(ms, 99):.0f} ms, max {max(ms):.0f} ms"


def schedule_checks(run: Run, asked: dict[str, Asked]):  # type: ignore[no-untyped-def]
    """No start before its due time; each start saw the due time its push asked for;
    the schedule index drained."""

    def verify(ev: Evidence) -> list[Check]:
        starts = [s for s in _timed_starts(run) if s["id"] in asked]
        early, wrong_due, local_only = [], [], 0
        first: dict[str, float] = {}
        for s in starts:
            a, due = asked[s["id"]], s["due_ms"]
            # + 1: the countdown goes to push.lua in whole ms, rounded up from seconds.
            if (
                due is None
                or not a.before_ms + a.countdown_ms <= due <= a.after_ms + a.countdown_ms + 1
            ):
                wrong_due.append(s["id"])
                continue
            started = s["redis_ms"]
            if started is None:  # Redis unreachable at that instant: the local clock
                local_only += 1
                started = s["t"] * 1000
            if started < due:
                early.append(f"{s['id']} {due - started:.0f} ms early")
            late_s = (started - due) / 1000
            first[s["id"]] = min(first.get(s["id"], late_s), late_s)
        unseen = sorted(set(asked) - {s["id"] for s in starts})
        left = int(run.client.zcard(KEYS.schedule))
        return [
            Check(
                "no scheduled task started before its due time (Redis clock)",
                not early and not unseen,
                f"{len(early)} early of {len(starts)} starts ({len(first)} tasks); lateness "
                f"of first starts {_lateness(list(first.values()))}"
                + (
                    f"; {local_only} timed by the local clock (Redis was down)"
                    if local_only
                    else ""
                )
                + (f"; early: {', '.join(early[:3])}" if early else "")
                + (f"; never started: {', '.join(unseen[:3])}" if unseen else ""),
            ),
            Check(
                "each start saw the due time its push asked for (push clock + countdown)",
                not wrong_due,
                f"{len(starts) - len(wrong_due)}/{len(starts)}"
                + (f"; wrong or missing: {', '.join(wrong_due[:3])}" if wrong_due else ""),
            ),
            Check("the schedule index is empty after the drain", left == 0, f"{left} left"),
        ]

    return verify


# -- scheduled-kills --------------------------------------------------------------------------
def _leader(run: Run):  # type: ignore[no-untyped-def]
    """The live worker whose embedded scanner holds the leader lease, or None."""
    holder = run.client.get(KEYS.leader) or ""
    for worker in run.cluster.live_workers():
        if holder == f"{worker.hostname}:{worker.pid}":
            return worker
    return None


def scheduled_kills(run: Run) -> None:
    # No standalone resurrector: the scanner leader is always a worker's, so killing
    # workers kills leaders.
    run.start(resurrector=False)
    asked = push_scheduled(run)
    horizon = _horizon_s(run.opts)
    planned = max(2, run.n // 50)
    kills: list[tuple[bool, int]] = []  # (took the leader, tasks still scheduled then)
    for k in range(planned):
        time.sleep(run.rng.uniform(0.6, 1.2) * horizon / (planned + 1))
        leader = _leader(run)
        others = [w for w in run.cluster.live_workers() if w is not leader]
        victim = leader if (k % 2 == 0 and leader is not None) or not others else None
        victim = victim or run.rng.choice(others)
        waiting = int(run.client.zcard(KEYS.schedule))
        running = {t: (0, f) for t, f in run.running_on(victim.hostname).items()}
        role = "the scanner leader" if victim is leader else "a worker"
        run.note(f"kill {k + 1}: {role}, {victim.name}, with {waiting} task(s) still scheduled")
        kill_worker(run, victim, running)
        kills.append((victim is leader, waiting))

    def verify(ev: Evidence) -> list[Check]:
        leaders = sum(1 for took, _ in kills if took)
        return [
            Check(
                "the kills took the scanner leader while tasks were still scheduled",
                leaders >= 1 and kills[0][1] > 0,
                f"{len(kills)} kill(s), {leaders} of the leader; scheduled at each: "
                + ", ".join(str(w) for _, w in kills),
            )
        ]

    run.verify(verify)
    run.verify(schedule_checks(run, asked))


def _kills_env(opts: Options) -> dict[str, str]:
    # worker-kill's queued grace (kills.py): a worker SIGKILLed between popping a
    # message and recording it takes the message along; only the grace brings it back.
    return {**LEASE_ENV, "RELIER_QUEUED_GRACE_S": str(round(10 + opts.tasks * 0.1, 1))}


SCHEDULED_KILLS = Scenario(
    "scheduled-kills",
    "tasks scheduled seconds ahead while whole workers (the scanner leader among them) "
    "are SIGKILLed and restarted",
    scheduled_kills,
    env=_kills_env,
)


# -- scheduled-redis-restart ------------------------------------------------------------------
def scheduled_redis_restart(run: Run) -> None:
    run.start()
    server = run.cluster.redis
    assert server is not None
    fsync_always(server)
    asked = push_scheduled(run)
    time.sleep(_horizon_s(run.opts) * 0.25)  # some ran; most still wait in the index
    waiting = set(run.client.zrange(KEYS.schedule, 0, -1))
    pid = server.pid
    server.kill()
    run.fault(f"kill -9 redis-server {pid} with {len(waiting)} task(s) in the schedule index")
    time.sleep(1.0)
    server.start()  # the same port and directory: it loads its append-only file
    fsync_always(server)
    reloaded = set(run.client.zrange(KEYS.schedule, 0, -1))
    run.fault(
        f"redis-server restarted on :{server.port} from its AOF ({len(reloaded)} task(s) "
        "in the schedule index)",
        interrupts=False,
    )
    log = server.directory / "redis.log"

    def verify(ev: Evidence) -> list[Check]:
        text = log.read_text(errors="replace") if log.exists() else ""
        return [
            Check(
                "the schedule index came back from the AOF",
                "DB loaded from append only file" in text
                and bool(reloaded)
                and reloaded <= waiting,
                f"{len(reloaded)} of the {len(waiting)} scheduled just before the kill"
                + (" (the rest were dispatched in between)" if reloaded < waiting else ""),
            )
        ]

    run.verify(verify)
    run.verify(schedule_checks(run, asked))
    run.note(
        "run with appendfsync always and RELIER_QUEUED_GRACE_S="
        f"{QUEUED_GRACE_S}, as redis-restart is (docs/chaos.md, known windows)"
    )


SCHEDULED_REDIS_RESTART = Scenario(
    "scheduled-redis-restart",
    "kill -9 Redis while tasks wait in the schedule index, restart it from its AOF",
    scheduled_redis_restart,
    env={**LEASE_ENV, "RELIER_QUEUED_GRACE_S": QUEUED_GRACE_S},
    celery={"task_publish_retry_policy": PUBLISH_RETRY},
)
