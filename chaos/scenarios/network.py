"""A real network cut between one worker and Redis, through :mod:`chaos.proxy`."""

from __future__ import annotations

import time

from ..runner import Run
from . import Scenario
from .common import stale_incarnation_checks, wait_refusals, wait_superseded


def network_partition(run: Run) -> None:
    assert run.cluster.redis is not None
    proxy = run.cluster.proxy_to_redis()
    # The cut-off worker reaches Redis (relier and the broker) only through the proxy.
    cut = run.cluster.start_worker("w1", redis_url=proxy.url(), wait=False)
    others = [
        run.cluster.start_worker(f"w{i + 1}", wait=False)
        for i in range(1, max(2, run.opts.workers))
    ]
    for worker in (cut, *others):
        worker.wait_ready(90)
    run.cluster.start_resurrector()
    run.push_all(run.items(run.n, (0.3, 1.2)))
    held: dict[str, int] = {}
    for _attempt in range(5):
        if not run.wait_running_on(cut.hostname, 20):
            break
        proxy.blackhole()
        held = run.running_on(cut.hostname)  # it can write nothing more now
        if held:
            break
        proxy.heal()
    if not held:
        run.note("partition: the proxied worker never ran a task; nothing to cut")
        run.verify(stale_incarnation_checks({}, "", "the cut-off worker"))
        return
    cut_at = time.time()
    ttl = float(run.setting("RELIER_HEARTBEAT_TTL_S"))
    run.fault(
        f"network cut {cut.name} <-> Redis (proxy :{proxy.port} blackholes both ways, "
        f"sockets stay open); {len(held)} task(s) running there",
        pids=[cut.pid, *(p.pid for p in cut.children())],
    )
    if not wait_superseded(run, held):
        run.note("partition: the cut-off tasks were not all resurrected within 90 s")
    time.sleep(max(0.0, cut_at + 3 * ttl - time.time()))  # at least three TTLs of silence
    proxy.heal()
    run.fault(
        f"healed after {time.time() - cut_at:.1f} s; {proxy.stats.held_connections} "
        f"connection(s) held through the cut deliver their late bytes now",
        interrupts=False,
    )
    wait_refusals(cut.log_path, held, timeout_s=45)
    run.verify(stale_incarnation_checks(held, cut.log_path.name, "the cut-off worker"))


NETWORK_PARTITION = Scenario(
    "network-partition",
    "blackhole one worker's TCP link to Redis past the TTL, then heal it",
    network_partition,
)
