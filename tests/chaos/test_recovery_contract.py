"""Recovery as a contract, on every CI run (issue 40): a small batch on real workers,
two pool processes and two whole workers SIGKILLed mid-task (the whole ones restarted),
then every task committed exactly once and the table of each kill → the killed task
running again, printed in the test log.

What fails the build is a task lost or committed twice. The timings are printed, not
held to a target (a shared, noisy machine): the one timing assertion is a sanity bound,
five times the documented one (6.5 s). It sits below the earliest a heartbeat expiry
could bring a task back (the 10 s TTL less one 3.3 s refresh interval, the defaults
here): a killed task running again later was not brought back by its holder's death (a
hand-off or a closed connection, "about a second", docs/worker-death.md) but by its TTL
running out, so recovery by death is broken.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import pytest

from relier_django import metrics
from relier_django.core.model import config
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from testproject.demo import tasks
from testproject.harness import CeleryWorker, wait_until

KEYS = KeySpace("rl")
TASKS = 40
SLEEP_S = 0.4
# docs/worker-death.md, "How long it takes": any process's death, back within about
# 1.3 s; then a free pool process on the worker that takes it.
DOCUMENTED_BOUND_S = 1.3
# Not a performance target: recovery by the TTL instead of by the death (see above).
SANITY_BOUND_S = DOCUMENTED_BOUND_S * 5


@dataclass(frozen=True)
class Start:
    fence: int
    at: float
    pid: int


@dataclass
class Kill:
    what: str
    at: float
    pids: frozenset[int]


def _starts(client, label: str) -> list[Start]:  # type: ignore[no-untyped-def]
    found = []
    for entry in client.lrange(f"demo:start:{label}", 0, -1):
        fence, at, pid = entry.split(":")
        found.append(Start(int(fence), float(at), int(pid)))
    return found


def _executions(client, label: str) -> list[int]:  # type: ignore[no-untyped-def]
    return [int(fence) for fence in client.lrange(f"demo:exec:{label}", 0, -1)]


def _running_on(client, labels: list[str], pids: set[int]) -> str | None:  # type: ignore[no-untyped-def]
    """A label whose latest run is in one of ``pids``, not done, and started less than
    half its length ago: killed now, it is still mid-body (never a run that just ended)."""
    now = time.time()
    for label in labels:
        starts = _starts(client, label)
        if not starts:
            continue
        last = starts[-1]
        if (
            last.pid in pids
            and now - last.at < SLEEP_S / 2
            and last.fence not in _executions(client, label)
        ):
            return label
    return None


def _kill_mid_task(client, labels: list[str], worker: CeleryWorker, whole: bool) -> Kill:  # type: ignore[no-untyped-def]
    def busy() -> str | None:
        return _running_on(client, labels, {p.pid for p in worker.children()})

    label = wait_until(busy, 30, what=f"a task running on {worker.name}")
    if whole:
        pids = frozenset(p.pid for p in worker.children())
        at = time.time()
        worker.kill()  # SIGKILL, main process and pool: nothing is handed off
        return Kill(f"whole worker {worker.name}", at, pids)
    pid = _starts(client, label)[-1].pid
    at = time.time()
    worker.kill_child(pid)
    return Kill(f"pool process of {worker.name}", at, frozenset({pid}))


def test_every_task_commits_once_through_pool_and_worker_kills_and_recovery_is_printed(
    worker_factory, redis_client, capsys: pytest.CaptureFixture[str]
):
    client = sync_client(config.current())
    w1, w2, w3 = (worker_factory(name=name) for name in ("w1", "w2", "w3"))
    labels = [f"rc-{i}" for i in range(TASKS)]
    receipts = [tasks.work.push(label, SLEEP_S) for label in labels]

    kills = [
        _kill_mid_task(client, labels, w1, whole=False),
        _kill_mid_task(client, labels, w2, whole=False),
        _kill_mid_task(client, labels, w3, whole=True),
        _kill_mid_task(client, labels, w2, whole=True),
    ]
    # Restarted under new hostnames; after both kills, so that a restart's few seconds
    # cannot let the batch run out before the second kill finds a task to interrupt.
    worker_factory(name="w3r")
    worker_factory(name="w2r")

    wait_until(
        lambda: all(r.status == "SUCCESS" for r in receipts), 45, what="every task to commit"
    )

    # Exactly once: each body's record is the one of its committed run, the counters
    # agree, and nothing waits in the DLQ (no task here is dead-lettered by design).
    # A second record is allowed only from a run killed after its body's last line and
    # before its commit (then its fence was superseded): it would show in the table.
    doubled = {}
    for label in labels:
        runs = _executions(client, label)
        last = _starts(client, label)[-1]
        killed = {s.fence for s in _starts(client, label) if any(s.pid in k.pids for k in kills)}
        assert runs.count(last.fence) == 1, (label, runs, _starts(client, label))
        if len(runs) > 1:
            assert set(runs) - {last.fence} <= killed, (label, runs, _starts(client, label))
            doubled[label] = runs
    found = metrics.read()
    assert found.counters["committed"] == TASKS
    assert client.zcard(KEYS.dlq) == 0

    # Kill → the killed task running again: each run a kill interrupted (started in a
    # killed process before the kill, never finished) and its next start.
    rows = []
    for number, kill in enumerate(kills, 1):
        for label in labels:
            starts = _starts(client, label)
            for i, start in enumerate(starts):
                interrupted = (
                    start.pid in kill.pids
                    and start.at < kill.at
                    and start.fence not in _executions(client, label)
                )
                if interrupted:
                    again = starts[i + 1]  # it committed, so a later run exists
                    rows.append((number, kill.what, label, (again.at - kill.at) * 1000))
    assert {number for number, *_ in rows} == set(range(1, len(kills) + 1)), rows

    latencies = [ms for *_, ms in rows]
    lines = [
        "",
        f"recovery contract: {TASKS} tasks of {SLEEP_S} s, {len(kills)} kills, "
        f"{TASKS} committed once, 0 lost, 0 in the DLQ, "
        f"{len(doubled)} bodies run again after a kill past their last line",
        f"{'kill':<5}{'what':<28}{'task':<8}{'kill → running again':>22}",
        *(f"{n:<5}{what:<28}{label:<8}{ms:>19.0f} ms" for n, what, label, ms in rows),
        f"p50 {statistics.median(latencies):.0f} ms, max {max(latencies):.0f} ms; documented: "
        f"back within about {DOCUMENTED_BOUND_S} s of a death, then a free pool process "
        f"(docs/worker-death.md); sanity bound {SANITY_BOUND_S:.1f} s (5x; a TTL expiry: 6.7 s+)",
    ]
    with capsys.disabled():  # shown in CI's log without -s
        print("\n".join(lines), flush=True)
    assert max(latencies) < SANITY_BOUND_S * 1000, lines
