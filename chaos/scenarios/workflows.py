"""Workflows under SIGKILLs and a Redis restart: relier's chains and chords, and Celery's
own canvas beside them, in the same worker processes, under the same faults.

relier's workload: chains of ``CHAIN_STEPS`` ``demo.step_add`` steps and chords of
``demo.step_add`` members with a ``demo.step_sum`` callback, built with Celery's canvas
API over ``@rl_task`` signatures (docs/workflows.md). Only a chain's first step and a
chord's members are pushed; every later step and every callback is created by a commit
(commit.lua). The shared invariants count what ``run.push`` pushed and match each commit
with a journaled run whose result names its fence; a workflow step is neither, so they
have nothing to count here, and this scenario's own checks take their place, from the
same kinds of evidence: the workers' ``committed`` log lines, the result keys (each
names the fence that committed it) and each step's runs, which ``demo.step_add`` records
in Redis (``demo:exec:step:<id>``, one ``<fence>:<worker>`` per run) with the input it
got (``demo:step-x:<id>``). The shared checks still hold the run to no leaked keys,
nothing in flight and no false deaths.

Celery's contender: the same chains and chords of ``demo.plain_add`` and
``demo.plain_sum`` (``acks_late``, ``reject_on_worker_lost``), with Celery's Redis result
backend on db 1 of the run's Redis. Decision: in the same worker processes. relier's
transport keeps kombu's full ack emulation for every message that is not relier's
(core/broker/redis_channel.py) and ``RelierBackend`` hands every record of a plain task,
chords included, to its fallback, Celery's own Redis backend: a plain task there is what
it is on kombu's own transport, and one SIGKILL takes both kinds of work. What Celery
loses is reported as figures, not invariants.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import redis

from testproject.harness import CeleryWorker

from ..evidence import KEYS, read_outcomes
from ..invariants import Check
from ..runner import Options, Run
from . import Scenario
from .common import kill_child, kill_worker
from .redis_faults import fsync_always, kill_and_restart_from_aof

CHAIN_STEPS = 5
STEP_S = (0.02, 0.2)  # each step's work, seconds (seeded)
OVERHEAD_S = 0.06  # a step's cost beside its work, for pacing only
PACE = 0.7  # the producer pushes at this share of what the workers can run
BACKEND = "relier_django.results:RelierBackend"
# A message popped at the instant of a SIGKILL or of Redis's death comes back only with
# the queued grace (docs/operations.md); shortened so that happens within the run, and
# above the queue's wait so that healthy queued steps are not re-dispatched.
QUEUED_GRACE_S = "10"
KILL_KINDS = ("relier pool process", "Celery pool process", "worker")

RedisError = (redis.exceptions.RedisError, OSError)


def sizes(opts: Options) -> tuple[int, int, int]:
    """(chains, chords, members per chord) of each engine: 10, 3 and 5 at small size
    (20 tasks), 200, 50 and 20 at full size (500)."""
    return max(10, opts.tasks * 2 // 5), max(3, opts.tasks // 10), min(20, max(5, opts.tasks // 25))


@dataclass(frozen=True)
class Spec:
    """One workflow, before it is pushed; relier and Celery each get it once."""

    kind: str  # chain | chord
    xs: tuple[int, ...]  # chain: the first step's x; chord: each member's x
    ys: tuple[int, ...]  # each step's (member's) y
    sleeps: tuple[float, ...]
    start: int = 0  # a chord callback's own argument

    def header(self) -> list[int]:
        """A chord's member results, in header order: what its callback must get."""
        return [x + y for x, y in zip(self.xs, self.ys, strict=True)]

    def inputs(self) -> list[Any]:
        """What each step must get as ``x``; for a chord, the callback's header."""
        if self.kind == "chord":
            return [self.header()]
        out: list[Any] = [self.xs[0]]
        for y in self.ys[:-1]:
            out.append(out[-1] + y)
        return out

    @property
    def expect(self) -> int:
        if self.kind == "chord":
            return self.start + sum(self.header())
        return self.xs[0] + sum(self.ys)


@dataclass(frozen=True)
class Flow:
    """A pushed workflow: its task ids, frozen by Celery at ``apply_async()``."""

    spec: Spec
    engine: str  # relier | celery
    steps: tuple[str, ...]  # a chain's steps in order; a chord's members in header order
    last: str  # a chain's last step; a chord's callback
    group: str = ""  # a chord's group id

    @property
    def ids(self) -> tuple[str, ...]:
        return self.steps if self.spec.kind == "chain" else (*self.steps, self.last)


# -- the workload -----------------------------------------------------------------------------
def specs(run: Run) -> list[Spec]:
    chains, chords, members = sizes(run.opts)

    def sleeps(n: int) -> tuple[float, ...]:
        return tuple(round(run.rng.uniform(*STEP_S), 3) for _ in range(n))

    out = [
        Spec("chain", (run.rng.randint(0, 999),),
             tuple(run.rng.randint(1, 9) for _ in range(CHAIN_STEPS)), sleeps(CHAIN_STEPS))
        for _ in range(chains)
    ] + [
        Spec("chord", tuple(run.rng.randint(0, 999) for _ in range(members)),
             tuple(run.rng.randint(1, 9) for _ in range(members)), sleeps(members),
             run.rng.randint(0, 99))
        for _ in range(chords)
    ]  # fmt: skip
    run.rng.shuffle(out)
    return out


def _lineage(last: Any) -> tuple[str, ...]:
    ids, node = [], last
    while node is not None:
        ids.append(node.id)
        node = node.parent
    return tuple(reversed(ids))


def push(spec: Spec, engine: str) -> Flow:
    """Celery's canvas API, the same for both engines; only the tasks differ."""
    from celery import chain, chord

    from testproject.demo import tasks

    add, total = (
        (tasks.step_add, tasks.step_sum)
        if engine == "relier"
        else (tasks.plain_add, tasks.plain_sum)
    )
    if spec.kind == "chain":
        first = add.s(spec.xs[0], spec.ys[0], sleep_s=spec.sleeps[0])
        rest = [add.s(y, sleep_s=s) for y, s in zip(spec.ys[1:], spec.sleeps[1:], strict=True)]
        last = chain(first, *rest).apply_async()
        ids = _lineage(last)
        return Flow(spec, engine, ids, ids[-1])
    header = [add.s(x, y, sleep_s=s) for x, y, s in zip(spec.xs, spec.ys, spec.sleeps, strict=True)]
    result = chord(header)(total.s(spec.start))
    members = tuple(r.id for r in result.parent.results)
    return Flow(spec, engine, members, result.id, result.parent.id)


def _drop_backend() -> None:
    """Celery keeps the result backend it built (per thread, unless it is thread-safe):
    dropped, so that the next use builds the one the run's settings name."""
    from relier_django import conf
    from testproject.celery import app

    app._backend_cache = None
    vars(app._local).pop("backend", None)
    conf.clear_cache()  # RESULT_BACKEND_FALLBACK is read from this run's environment


def setup(run: Run) -> dict[str, Any]:
    """The run's Redis, with relier's result backend (Celery's Redis backend on db 1 as
    its fallback, for the plain tasks) in the producer and every worker."""
    server = run.cluster.start_redis()
    run.cluster.env.update(
        {
            "CELERY_RESULT_BACKEND": BACKEND,
            "RELIER_RESULT_BACKEND_FALLBACK": f"redis://127.0.0.1:{server.port}/1",
        }
    )
    return {"result_backend": BACKEND}


# -- the faults -------------------------------------------------------------------------------
Running = dict[str, tuple[int, int]]  # task id -> (pool process PID, fence)


def _relier_running(run: Run, ids: list[str]) -> list[tuple[CeleryWorker, Running]]:
    """The live workers running relier steps, each with those steps."""
    states = run.task_states(ids)
    out = []
    for worker in run.cluster.live_workers():
        running = {
            task_id: (int(s["worker"].rsplit(":", 1)[1]), int(s["fence"]))
            for task_id, s in states.items()
            if s["state"] == "running" and s["worker"].startswith(f"{worker.hostname}:")
        }
        if running:
            out.append((worker, running))
    return out


def _celery_running(run: Run) -> list[tuple[CeleryWorker, dict[int, str]]]:
    """Per live worker: its pool processes running a plain task (PID -> task id)."""
    by_pid = {
        int(pid): str(task_id) for pid, task_id in run.client.hgetall("demo:plain-running").items()
    }
    out = []
    for worker in run.cluster.live_workers():
        mine = {p.pid: by_pid[p.pid] for p in worker.children() if p.pid in by_pid}
        if mine:
            out.append((worker, mine))
    return out


def _poll(
    find: Callable[[], list[tuple[CeleryWorker, Any]]], run: Run, timeout_s: float = 15
) -> Any:
    """A (worker, what it runs) pair, seeded, once ``find`` sees one; None on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            found = find()
        except RedisError:
            found = []
        if found:
            return run.rng.choice(sorted(found, key=lambda pair: pair[0].name))
        time.sleep(0.05)
    return None


@dataclass
class Hits:
    relier: dict[str, int]  # step id -> the fence its killed run had
    celery: list[str]  # plain task ids whose run a kill took
    kinds: Counter[str]


def _kill(run: Run, kind: str, relier_ids: list[str], hits: Hits, lock: threading.Lock) -> bool:
    """One kill of ``kind``; False when nothing of that kind was running to kill. A
    whole worker is killed and replaced under ``lock``, the supervisor's."""
    if kind == "relier pool process":
        found = _poll(lambda: _relier_running(run, relier_ids), run)
        hit = kill_child(run, *found) if found else {}
        hits.relier.update({t: fence for t, (_, fence) in hit.items()})
        return bool(hit)
    if kind == "Celery pool process":
        found = _poll(lambda: _celery_running(run), run)
        if found is None:
            return False
        worker, by_pid = found
        pid = run.rng.choice(sorted(by_pid))
        os.kill(pid, signal.SIGKILL)
        run.fault(f"SIGKILL pool process {pid} of {worker.name} (running plain task)", pids=[pid])
        hits.celery.append(by_pid[pid])
        return True
    found = _poll(lambda: _relier_running(run, relier_ids), run) or _poll(
        lambda: [(w, {}) for w in run.cluster.live_workers()], run
    )
    if found is None:
        return False
    worker, running = found
    try:
        plain = next((p for w, p in _celery_running(run) if w is worker), {})
    except RedisError:
        plain = {}
    with lock:
        if not worker.alive():  # it died meanwhile: the supervisor's to restart
            return False
        kill_worker(run, worker, running)
    hits.relier.update({t: fence for t, (_, fence) in running.items()})
    hits.celery.extend(plain.values())
    return True


def _restart_redis(run: Run, gate: threading.Lock) -> str:
    """kill -9 of redis-server, restarted from its AOF a second later, as redis-restart
    does; the producer waits meanwhile (``gate``)."""
    server = run.cluster.redis
    assert server is not None
    with gate:
        before, after = kill_and_restart_from_aof(run, server, "mid-workflows")
    log = server.directory / "redis.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    loaded = "DB loaded from append only file" in text and after > 0
    return f"{'reloaded' if loaded else 'NOT reloaded'}: {after} keys ({before} before the kill)"


class Supervisor:
    """Restarts a worker whose main process exited by itself, as systemd or Kubernetes
    would (the runner's own kills restart theirs); both hold ``lock``, so that a killed
    worker is replaced once. Runs only while the scenario's body does: nothing is
    started once the run is being torn down."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.lock = threading.Lock()
        self.exits: list[str] = []  # "<worker>: <why>", from its log
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="chaos-supervisor", daemon=True)

    def __enter__(self) -> Supervisor:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(120)

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            with self.lock:
                for slot, worker in list(self.run.cluster.slots.items()):
                    if worker.process is None or worker.alive() or self._stop.is_set():
                        continue
                    found = _UNRECOVERABLE.findall(worker.log_text())
                    why = found[-1] if found else f"exit {worker.process.returncode}"
                    self.exits.append(f"{worker.name}: {why}")
                    worker.kill()  # its pool processes, if any outlived it
                    self.run.fault(f"worker {worker.name} exited by itself ({why})")
                    fresh = self.run.cluster.replace(slot)
                    self.run.fault(
                        f"supervisor: {worker.name} replaced by {fresh.name}", interrupts=False
                    )


_UNRECOVERABLE = re.compile(r"Unrecoverable error: (.+)")


# -- the scenario -----------------------------------------------------------------------------
def workflows(run: Run) -> None:
    todo = specs(run)
    flows: list[Flow] = []
    gate = threading.Lock()
    assert run.cluster.redis is not None
    fsync_always(run.cluster.redis)
    run.start()
    processes = max(1, len(run.cluster.live_workers())) * run.cluster.concurrency
    tasks = 2 * sum(len(s.ys) + (s.kind == "chord") for s in todo)  # both engines
    work_s = sum(STEP_S) / 2 + OVERHEAD_S
    over_s = tasks * work_s / processes / PACE

    def produce() -> None:
        pause = over_s / len(todo)
        for spec in todo:
            for engine in ("relier", "celery"):
                with gate:  # never while Redis is down: the restart holds the gate
                    try:
                        flows.append(push(spec, engine))
                    except Exception as exc:  # not pushed: not counted
                        run.push_failures.append(f"{engine} {spec.kind}: {exc!r}")
            time.sleep(pause)

    _drop_backend()
    run.report.started_at = time.time()
    producer = threading.Thread(target=produce, name="chaos-workflows", daemon=True)
    planned = max(3, run.n // 50)
    hits = Hits({}, [], Counter())
    restarted = ""
    with Supervisor(run) as supervisor:
        producer.start()
        for k in range(planned + 1):
            time.sleep(run.rng.uniform(0.5, 1.5) * over_s / (planned + 2))
            if k == planned // 2 + 1:  # the Redis restart, between the kills
                restarted = _restart_redis(run, gate)
                continue
            kind = KILL_KINDS[(k if k <= planned // 2 else k - 1) % len(KILL_KINDS)]
            relier_ids = [i for f in list(flows) if f.engine == "relier" for i in f.ids]
            if _kill(run, kind, relier_ids, hits, supervisor.lock):
                hits.kinds[kind] += 1
            else:
                run.note(f"kill {k + 1} ({kind}): nothing of that kind was running; skipped")
        producer.join()
        _drop_backend()  # the next scenario builds its own
        _wait_ended(run, [f.last for f in flows if f.engine == "relier"])
    if supervisor.exits:
        run.note(
            f"workers exited by themselves {len(supervisor.exits)} time(s) and the supervisor "
            "restarted them: " + "; ".join(supervisor.exits)
        )
    run.verify(lambda _ev: checks(run, flows, hits, planned, restarted))
    run.note(
        "the shared invariants count pushed tasks (run.push) and journaled runs; workflow "
        "steps are neither (created by commits, recorded in Redis), so the checks after them "
        "are this scenario's own, from commits, result keys and each step's recorded runs; "
        "the runner's recovery latency reads the journal and measures none here"
    )
    run.note(
        f"run with RELIER_QUEUED_GRACE_S={QUEUED_GRACE_S} and appendfsync always, as "
        "worker-kill and redis-restart; the producer waits while Redis is down"
    )


def _wait_ended(run: Run, last: list[str]) -> None:
    """Until every relier workflow has its final result (the supervisor still watching)."""
    deadline = time.monotonic() + run.quiescence_timeout_s
    while time.monotonic() < deadline:
        try:
            if all(o is not None for o in read_outcomes(run.client, last).values()):
                return
        except RedisError:
            pass
        time.sleep(0.25)


# -- the evidence -----------------------------------------------------------------------------
@dataclass
class Seen:
    """What one engine's steps left in Redis."""

    runs: dict[str, list[str]]  # step id -> its recorded runs, in order
    inputs: dict[str, list[Any]]  # step id -> the x of each run
    done: dict[str, list[Any]]  # step id -> its results (relier: the committed one)


def _lists(client: Any, pattern: str, ids: list[str], decode: bool) -> dict[str, list[Any]]:
    pipe = client.pipeline(transaction=False)
    for task_id in ids:
        pipe.lrange(pattern.format(task_id), 0, -1)
    out = {}
    for task_id, items in zip(ids, pipe.execute(), strict=True):
        out[task_id] = [json.loads(i) for i in items] if decode else list(items)
    return out


def _seen(client: Any, flows: list[Flow], engine: str) -> Seen:
    ids = [i for f in flows if f.engine == engine for i in f.ids]
    if engine == "relier":
        outcomes = read_outcomes(client, ids)
        return Seen(
            _lists(client, "demo:exec:step:{}", ids, False),
            _lists(client, "demo:step-x:{}", ids, True),
            {t: [o] if o else [] for t, o in outcomes.items()},
        )
    return Seen(
        _lists(client, "demo:plain-exec:{}", ids, False),
        _lists(client, "demo:plain-x:{}", ids, True),
        _lists(client, "demo:plain-done:{}", ids, True),
    )


# The evidence's own pattern takes a task id as \w+ (the runner's pushes use uuid4().hex);
# Celery freezes a workflow's ids as str(uuid4()), with hyphens.
_COMMITTED = re.compile(r"committed task_id=([\w-]+) fence=(\d+)")


def logged_commits(run: Run) -> dict[str, list[int]]:
    """Task id -> the fence of each accepted commit, from every worker's log."""
    out: dict[str, list[int]] = {}
    for path in run.cluster.log_paths():
        for m in _COMMITTED.finditer(path.read_text(errors="replace")):
            out.setdefault(m.group(1), []).append(int(m.group(2)))
    return out


def _ids(ids: list[str], limit: int = 3) -> str:
    return ", ".join(ids[:limit]) + (f" (+{len(ids) - limit} more)" if len(ids) > limit else "")


def _wrong(flows: list[Flow], seen: Seen) -> Iterator[tuple[str, str]]:
    """(task id, what is wrong) for every step of ``flows`` whose inputs were not the
    ones its workflow must give it."""
    for flow in flows:
        wanted = flow.spec.inputs()
        if flow.spec.kind == "chain":
            pairs = list(zip(flow.steps, wanted, strict=True))
        else:
            pairs = [(flow.last, wanted[0]), *zip(flow.steps, flow.spec.xs, strict=True)]
        for task_id, x in pairs:
            got = seen.inputs.get(task_id, [])
            if any(g != x for g in got):
                yield task_id, f"got {got}, expected {x}"


def checks(run: Run, flows: list[Flow], hits: Hits, planned: int, restarted: str) -> list[Check]:
    client = run.client
    relier = [f for f in flows if f.engine == "relier"]
    seen = _seen(client, flows, "relier")
    commits = logged_commits(run)

    def committed_value(task_id: str) -> Any:
        outcome = (seen.done.get(task_id) or [None])[0] or {}
        return outcome.get("result") if outcome.get("status") == "ok" else None

    chains = [f for f in relier if f.spec.kind == "chain"]
    chords = [f for f in relier if f.spec.kind == "chord"]
    # Each step's committed value, not only the last one's: x + y of the run it committed.
    unfinished = [
        f.last
        for f in chains
        if [committed_value(t) for t in f.steps] != [*f.spec.inputs()[1:], f.spec.expect]
    ]
    steps = [i for f in relier for i in f.ids]
    bad_commit, from_result, reruns, not_increasing = [], 0, 0, []
    for task_id in steps:
        outcome = (seen.done.get(task_id) or [None])[0] or {}
        fences = [int(r.split(":", 1)[0]) for r in seen.runs.get(task_id, [])]
        logged = commits.get(task_id, [])
        fence = outcome.get("fence") if outcome.get("status") == "ok" else None
        from_result += bool(fence is not None and not logged)
        if fence is None or len(logged) > 1 or (logged and logged != [fence]):
            bad_commit.append(task_id)
        elif not fences or fences[-1] != fence:
            bad_commit.append(task_id)  # the result is no recorded run's
        if fences != sorted(set(fences)):
            not_increasing.append(task_id)
        reruns += len(fences) > 1
    callbacks_bad = [
        f.last
        for f in chords
        if committed_value(f.last) != f.spec.expect
        or len(commits.get(f.last, [])) > 1
        or not seen.inputs.get(f.last)
    ]
    states_left = [f.group for f in chords if client.exists(KEYS.chord(f.group))]
    wrong_inputs = list(_wrong(relier, seen))
    resurrected = sum(
        1 for t, fence in hits.relier.items()
        if ((seen.done.get(t) or [None])[0] or {}).get("fence", 0) > fence
    )  # fmt: skip
    kills = ", ".join(f"{n} {k} kill(s)" for k, n in sorted(hits.kinds.items())) or "none"
    out = [
        Check(
            "every relier chain ended with the right result, each step on the way with its own",
            not unfinished,
            f"{len(chains) - len(unfinished)}/{len(chains)}"
            + (f"; not: {_ids(unfinished)}" if unfinished else ""),
        ),
        Check(
            "every relier step committed once, at the fence of its last recorded run",
            not bad_commit,
            f"{len(steps) - len(bad_commit)}/{len(steps)} steps, chord members and callbacks"
            + (
                f"; {from_result} known from the result key only (log line lost)"
                if from_result
                else ""
            )
            + (f"; not: {_ids(bad_commit)}" if bad_commit else ""),
        ),
        Check(
            "each step ran only at increasing fences (again only after its run was cut off)",
            not not_increasing,
            f"{reruns} step(s) ran more than once"
            + (f"; out of order: {_ids(not_increasing)}" if not_increasing else ""),
        ),
        Check(
            "each step got its predecessor's committed result (a member its own arguments)",
            not wrong_inputs,
            f"{len(wrong_inputs)} wrong" + "".join(f"; {t}: {w}" for t, w in wrong_inputs[:3]),
        ),
        Check(
            "every chord callback committed once, with the complete header in order",
            not callbacks_bad,
            f"{len(chords) - len(callbacks_bad)}/{len(chords)}"
            + (f"; not: {_ids(callbacks_bad)}" if callbacks_bad else ""),
        ),
        Check(
            "every chord's state was dropped by its callback's commit",
            not states_left,
            f"{len(states_left)} left" + (f": {_ids(states_left)}" if states_left else ""),
        ),
        Check(
            # Each kind landed at least once; a kill whose kind had nothing running at
            # its instant is skipped (and noted): at full size one or two are.
            "the kills hit running steps: relier's and Celery's, of every kind",
            all(hits.kinds[kind] for kind in KILL_KINDS) and bool(hits.relier and hits.celery),
            f"{sum(hits.kinds.values())}/{planned} kills ({kills}); {len(hits.relier)} relier "
            f"step(s) and {len(hits.celery)} Celery task(s) cut off",
        ),
        Check(
            "the Redis restart reloaded its data from the AOF",
            restarted.startswith("reloaded"),
            restarted or "not done",
        ),
    ]
    run.note(f"interrupted relier steps: {resurrected}/{len(hits.relier)} committed at a "
             "higher fence, the rest had committed before the kill landed")  # fmt: skip
    run.note(figures(client, flows, seen, commits))
    return out


def figures(
    client: Any, flows: list[Flow], relier_seen: Seen, commits: dict[str, list[int]]
) -> str:
    """Both engines' workflows side by side: figures, not invariants. A relier step is
    done when it committed (its commits counted from the logs, or its result key when
    the line was lost); a Celery step when a run reached its end."""
    rows = []
    for engine in ("relier", "celery"):
        mine = [f for f in flows if f.engine == engine]
        seen = relier_seen if engine == "relier" else _seen(client, flows, engine)
        chains = [f for f in mine if f.spec.kind == "chain"]
        chords = [f for f in mine if f.spec.kind == "chord"]
        steps = [i for f in mine for i in f.ids]

        def done(task_id: str, s: Seen = seen, relier: bool = engine == "relier") -> int:
            if relier:
                return max(len(commits.get(task_id, [])), len(s.done.get(task_id, [])))
            return len(s.done.get(task_id, []))

        never = sum(1 for f in chains if done(f.last) == 0)
        wrong = sum(
            1 for f in mine if done(f.last) and f.spec.expect not in _values(seen, f.last, engine)
        )
        cb_never = sum(1 for f in chords if done(f.last) == 0)
        cb_twice = sum(1 for f in chords if done(f.last) > 1)
        twice = sum(1 for t in steps if done(t) > 1)
        ran_never = sum(1 for t in steps if not seen.runs.get(t))
        again = sum(1 for t in steps if len(seen.runs.get(t, [])) > 1)
        rows.append(
            f"{engine}: chains never finished {never}/{len(chains)}, chord callbacks never "
            f"run {cb_never}/{len(chords)} and completed twice {cb_twice}, wrong final "
            f"results {wrong}, steps completed twice {twice}/{len(steps)}, never run "
            f"{ran_never}, started again {again}"
        )
    return (
        "figures, same workers, same faults (relier's 'completed' is its commit; Celery's a "
        "run that reached its end; Celery with acks_late, reject_on_worker_lost and the "
        "chaos-sized visibility timeout of 6 s): " + "; ".join(rows)
    )


def _values(seen: Seen, task_id: str, engine: str) -> list[Any]:
    done = seen.done.get(task_id, [])
    return [o.get("result") for o in done] if engine == "relier" else done


WORKFLOWS = Scenario(
    "workflows",
    "chains and chords (relier's, and Celery's own canvas beside them) under SIGKILLs "
    "and a Redis restart",
    workflows,
    env={"RELIER_QUEUED_GRACE_S": QUEUED_GRACE_S},
    setup=setup,
)
