"""Faults on Redis itself: a crash and restart from the AOF, a Sentinel failover."""

from __future__ import annotations

import time
from typing import Any

from testproject.harness import wait_until

from ..evidence import Evidence
from ..invariants import Check
from ..runner import Run
from . import Scenario

# A message kombu popped at the instant Redis died is lost by the broker; only the
# queued grace brings it back (docs/operations.md). Shortened so that path completes
# within the run. It must stay above the backlog a task waits in the queue, or
# healthy queued tasks are re-dispatched too (harmless, fenced, but noisy), so the
# producer paces itself below the workers' capacity.
QUEUED_GRACE_S = "4"
PACE = 0.6  # the producer pushes at this share of what the workers can run
# A publish must outlast the outage (Celery's default retries give up after ~0.6 s),
# as a producer that expects Redis restarts configures it.
PUBLISH_RETRY = {"max_retries": 12, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 1}


def _processes(run: Run) -> int:
    return max(1, len(run.cluster.live_workers())) * run.cluster.concurrency


def _paced_workload(run: Run) -> None:
    work = (0.2, 0.6)
    over_s = run.n * (sum(work) / 2) / _processes(run) / PACE
    run.produce(run.items(run.n, work), over_s=over_s)
    wait_until(lambda: run.ended() >= max(1, run.n // 4), 180, 0.1, "a quarter of the workload")


# -- redis-restart ----------------------------------------------------------------------------
def fsync_always(server: Any) -> None:
    with server.client() as client:
        client.config_set("appendfsync", "always")


def kill_and_restart_from_aof(run: Run, server: Any, what: str) -> tuple[int, int]:
    """kill -9 of ``server``, restarted a second later on the same port and directory
    (it loads its append-only file), each step a fault of ``run``; the keys just before
    the kill and just after the restart."""
    pid = server.pid
    with server.client() as client:
        before = int(client.dbsize())
    server.kill()
    run.fault(f"kill -9 redis-server {pid} {what} ({before} keys)")
    time.sleep(1.0)
    server.start()
    fsync_always(server)
    with server.client() as client:
        after = int(client.dbsize())
    run.fault(
        f"redis-server restarted on :{server.port} from its AOF ({after} keys loaded)",
        interrupts=False,
    )
    return before, after


def redis_restart(run: Run) -> None:
    run.start()
    server = run.cluster.redis
    assert server is not None
    fsync_always(server)
    _paced_workload(run)
    before, after = kill_and_restart_from_aof(run, server, "mid-workload")
    log = server.directory / "redis.log"

    def verify(ev: Evidence) -> list[Check]:
        text = log.read_text(errors="replace") if log.exists() else ""
        loaded = "DB loaded from append only file" in text
        slow_fsync = text.count("Asynchronous AOF fsync is taking too long")
        if slow_fsync:
            run.note(
                f"Redis logged {slow_fsync} slow AOF fsync(s): writes in that window are "
                "outside G8's 1 s AOF window promise"
            )
        return [
            Check(
                "the restarted server reloaded its data from the AOF",
                loaded and after > 0,
                f"{after} keys after the restart ({before} just before the kill)",
            )
        ]

    run.verify(verify)
    run.note(
        "run with appendfsync always: with everysec (the default) Redis may keep an "
        "acknowledged write in memory for up to 2 s while a background fsync runs, and a "
        "commit lost that way is redone after the crash (result once, side effects twice; "
        "docs/operations.md), which this check would count as committed twice"
    )
    run.note(
        f"run with RELIER_QUEUED_GRACE_S={QUEUED_GRACE_S}: a message kombu popped at the "
        "instant Redis died is lost by the broker (a documented window) and only the "
        "queued grace brings it back; the default (1 h) would hold this run that long"
    )


REDIS_RESTART = Scenario(
    "redis-restart",
    "kill -9 Redis mid-workload, restart it from its AOF on the same port",
    redis_restart,
    env={"RELIER_QUEUED_GRACE_S": QUEUED_GRACE_S},
    celery={"task_publish_retry_policy": PUBLISH_RETRY},
)


# -- redis-failover ---------------------------------------------------------------------------
# A TTL above the failover time (2-4 s on loopback): running tasks keep their incarnation
# through the outage instead of all being resurrected.
FAILOVER_ENV = {"RELIER_HEARTBEAT_TTL_S": "8", "RELIER_QUEUED_GRACE_S": "20"}
_groups: dict[int, Any] = {}


def failover_setup(run: Run) -> dict[str, Any]:
    from testproject.celery import app
    from testproject.harness import SentinelGroup

    group = SentinelGroup(directory=run.run_dir / "sentinel-group")
    run.cluster.adopt(group)  # stopped with everything else, even if start() fails half-way
    group.start()
    _groups[id(run)] = group
    run.cluster.env.update(group.env())
    run.cluster.redis_url = group.redis_url
    run.client_factory = lambda: group.master().client(decode_responses=True)
    options = {**(app.conf.broker_transport_options or {}), "master_name": group.master_name}
    return {"broker_transport_options": options, "task_publish_retry_policy": PUBLISH_RETRY}


def redis_failover(run: Run) -> None:
    group = _groups.pop(id(run))
    run.start()
    _paced_workload(run)
    replica = next(s for s in group.servers if s is not group.master())
    old = group.kill_master_when_replicated()
    killed = time.time()
    run.fault(f"SIGKILL of the master redis-server :{old.port} (at a fully replicated instant)")
    new = group.wait_for_failover(old, timeout_s=60)
    run.fault(
        f"the sentinels promoted :{new.port} after {time.time() - killed:.1f} s; nobody was told",
        interrupts=False,
    )

    def verify(ev: Evidence) -> list[Check]:
        return [
            Check(
                "the replica became master and every client found it by itself",
                new is replica,
                f"master :{old.port} -> :{new.port}",
            )
        ]

    run.verify(verify)
    run.note(
        "the master is killed when its replica holds every acknowledged write (CLIENT PAUSE "
        "WRITE, then offsets equal): this proves the failover itself loses nothing; Redis "
        "replication is asynchronous, so writes acknowledged in a master's last instant "
        "can still be lost with it (docs/operations.md, the replication window)"
    )


REDIS_FAILOVER = Scenario(
    "redis-failover",
    "SIGKILL the Redis master mid-workload; Sentinel promotes the replica",
    redis_failover,
    env=FAILOVER_ENV,
    setup=failover_setup,
)
