"""Flow control through deaths (G14): a slot belongs to its task, not to the process
running it. A worker SIGKILLed while its tasks hold slots: each task comes back within
the death-detection bound holding its slot (a key's order holds), and the slots free
as they finish. A zombie (stopped past its TTL, resumed after its successor
committed) holds nothing: its refused commit frees no slot, so the next task of its
key never runs beside the one the successor handed the slot to.

Counted from the tasks' own start and end records (testproject/demo/limit_tasks.py).
"""

from __future__ import annotations

import os
import signal
import time

from relier_django.core.model import config
from relier_django.core.store.connection import sync_client
from testproject.demo import limit_tasks
from testproject.harness import wait_until

from ..integration.test_limits import _most_at_once, _no_limit_keys_left, _records, _wait_for

QUICK = {"RELIER_SCAN_INTERVAL_S": "0.5"}


def test_a_whole_worker_killed_with_slots_held_keeps_every_key_in_order(
    worker_factory, redis_client
):
    """3 keys x 6 tasks, one at a time per key; the worker running them is SIGKILLed
    mid-run: every task still runs, each key's starts stay in push order, never two at
    once, and the killed runs come back by the closed connection, not the 10 s TTL."""
    client = sync_client(config.current())
    worker_factory(name="survivor", concurrency=4, extra_env=QUICK)
    doomed = worker_factory(name="doomed", concurrency=4, extra_env=QUICK)
    run = "kill"
    for i in range(6):
        for key in ("a", "b", "c"):
            limit_tasks.sequence.push(run, key, f"{key}{i}", 0.3)
    wait_until(lambda: len(_records(client, run)) >= 4, 30, what="runs under way")
    killed_at = time.monotonic()
    doomed.kill()
    _wait_for(client, 18, run, timeout_s=90)
    records = _records(client, run)
    ended = [r for r in records if r[0] == "end"]
    assert sorted({label for _, _, label, _, _ in ended}) == sorted(
        f"{key}{i}" for i in range(6) for key in ("a", "b", "c")
    )
    assert (
        max(_most_at_once([r for r in records if (r[2], r[3]) in _finished(records)]).values()) == 1
    )
    for key in ("a", "b", "c"):
        order = [label for kind, k, label, _, _ in records if kind == "end" and k == key]
        assert order == [f"{key}{i}" for i in range(6)], order
    assert time.monotonic() - killed_at < 60
    _no_limit_keys_left(redis_client)


def _finished(records):  # type: ignore[no-untyped-def]
    """(label, fence) of the runs that ended: a run the kill cut short has a start and
    no end, and held its slot only until the kill."""
    return {(label, fence) for kind, _, label, fence, _ in records if kind == "end"}


def test_a_zombie_holds_no_slot(worker_factory, redis_client):
    """Key 'z', one at a time: z0 is stopped in its run past its TTL, resurrected and
    committed by another worker, which hands the slot to z1; z0's zombie resumes and
    its commit is refused: z2 still waits for z1, never runs beside it."""
    client = sync_client(config.current())
    fast = {**QUICK, "RELIER_HEARTBEAT_TTL_S": "2"}
    first = worker_factory(name="first", concurrency=2, extra_env=fast)
    run = "zombie"
    z0 = limit_tasks.sequence.push(run, "z", "z0", 1.5)
    wait_until(lambda: len(_records(client, run)) >= 1, 30, what="z0 running")
    pid = int(client.lindex(f"demo:lim:{run}", 0).split(":")[-1])
    assert pid in [p.pid for p in first.children()]
    os.kill(pid, signal.SIGSTOP)
    try:
        worker_factory(name="second", concurrency=2, extra_env=fast)
        limit_tasks.sequence.push(run, "z", "z1", 1.0)
        limit_tasks.sequence.push(run, "z", "z2", 0.2)
        assert z0.get(timeout=60) == "z0"  # by its second incarnation
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_until(lambda: any(r[0] == "end" and r[2] == "z2" for r in _records(client, run)), 60,
               what="z2 to end")  # fmt: skip
    wait_until(lambda: "stale commit rejected" in first.log_text()
               or "superseded" in first.log_text(), 30, what="the zombie to end")  # fmt: skip
    records = _records(client, run)
    live = [r for r in records if not (r[2] == "z0" and r[3] == 1)]  # the zombie's run
    assert max(_most_at_once(live).values()) == 1, records
    starts = [label for kind, _, label, fence, _ in live if kind == "start"]
    assert starts == ["z0", "z1", "z2"]
    _no_limit_keys_left(redis_client)
