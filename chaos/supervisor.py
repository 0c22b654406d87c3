"""Everything one scenario starts, and the supervisor that restarts what it kills.

Built on ``testproject/harness.py`` (RedisServer, CeleryWorker) and, for a scenario
whose broker is RabbitMQ, ``testproject/rabbitmq.py`` (RabbitServer), or whose store is
a Redis Cluster, ``testproject/cluster.py`` (ClusterGroup). Every process is
recorded the moment it runs and is stopped by PID (workers by their own process
group) in :meth:`Cluster.stop`, which runs in a ``finally`` and again at interpreter
exit (``atexit``), so a failing or interrupted run leaves nothing behind.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from testproject.cluster import ClusterGroup
from testproject.harness import REPO_ROOT, CeleryWorker, RedisServer, wait_until, worker_env
from testproject.rabbitmq import RabbitServer

from .proxy import BlackholeProxy

# Seconds, chaos-sized: a dead worker's tasks come back within TTL + scan interval.
HEARTBEAT_TTL_S = 2.0
SCAN_INTERVAL_S = 0.3

FAST_ENV: dict[str, str] = {
    "RELIER_HEARTBEAT_TTL_S": str(HEARTBEAT_TTL_S),
    "RELIER_SCAN_INTERVAL_S": str(SCAN_INTERVAL_S),
    "RELIER_LEADER_LEASE_S": "2",
    "RELIER_DRAIN_TIMEOUT_S": "2",
    "TESTPROJECT_LOG_LEVEL": "INFO",
    # kombu gives an unacknowledged message back after this long; short, so that the
    # broker's own copies of a dead worker's messages come back (and are refused as
    # stale) within the run, and "nothing unacknowledged" is part of quiescence.
    "CELERY_VISIBILITY_TIMEOUT": "6",
    "CELERY_UNACKED_RESTORE_INTERVAL": "0.5",
    "CELERY_UNACKED_RESTORE_THROTTLE": "1",
    # The workload needs no second database, whatever the calling test session has.
    "TESTPROJECT_POSTGRES_URL": "",
}

_live: list[Cluster] = []
_live_lock = threading.Lock()


def _stop_all_at_exit() -> None:
    with _live_lock:
        clusters = list(_live)
    for cluster in clusters:
        cluster.stop()


atexit.register(_stop_all_at_exit)


@dataclass(eq=False)
class Cluster:
    """A private Redis (and, for some scenarios, a private RabbitMQ node as Celery's
    broker, or a private Redis Cluster as relier's store), worker slots, a standalone
    resurrector and proxies."""

    run_dir: Path
    env: dict[str, str] = field(default_factory=dict)  # RELIER_*/CELERY_* for every process
    concurrency: int = 2
    redis: RedisServer | None = None
    redis_url: str = ""  # where processes connect (a Sentinel group sets its own env)
    rabbit: RabbitServer | None = None  # Celery's broker when not on Redis
    store_cluster: ClusterGroup | None = None  # relier's store when on a Redis Cluster
    slots: dict[str, CeleryWorker] = field(default_factory=dict)  # slot -> current worker
    workers: list[CeleryWorker] = field(default_factory=list)  # every worker ever started
    resurrector: subprocess.Popen[bytes] | None = None
    proxies: list[BlackholeProxy] = field(default_factory=list)
    _generation: dict[str, int] = field(default_factory=dict)
    _stoppables: list[object] = field(default_factory=list)  # anything else with stop()

    def __post_init__(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with _live_lock:
            _live.append(self)

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "logs"

    # -- servers -----------------------------------------------------------------------
    def start_redis(self) -> RedisServer:
        self.redis = RedisServer(directory=self.run_dir / "redis")
        self.redis.start()
        self.redis_url = self.redis.url
        return self.redis

    def start_rabbitmq(self) -> RabbitServer:
        """A private RabbitMQ node as Celery's broker for every process started after this
        and for the runner's producer; relier's store stays on Redis."""
        self.rabbit = RabbitServer(self.run_dir / "rabbitmq")  # recorded first: stop() reaches it
        self.rabbit.start()
        self.env["CELERY_BROKER_URL"] = self.rabbit.url
        return self.rabbit

    def start_redis_cluster(
        self, partitions: int, masters: int = 3, replicas: int = 1
    ) -> ClusterGroup:
        """A private Redis Cluster (``masters`` masters, ``replicas`` replicas each) as
        relier's store, split into ``partitions``, for every process started after this
        and for the runner's producer; Celery's broker stays on the private Redis (a
        cluster is no Celery broker): start that first.

        The processes' seed URL names the "home" master, the one serving the ``{g}``
        slot (liveness connections, the scanner lease). A process started before a
        failover finds the cluster through every node it has seen (and a prefork pool
        process through its parent's: ``relier_django/core/store/cluster.py``); one that
        starts while its seed is down would not: fail the home master over only while
        no process starts."""
        group = ClusterGroup(self.run_dir / "redis-cluster", masters=masters, replicas=replicas)
        self.store_cluster = group  # recorded first: stop() reaches every node it started
        group.start()
        home = group.node_of_key("{g}")
        self.env.update({
            "RELIER_REDIS_URL": f"redis://127.0.0.1:{home.port}",
            "RELIER_CLUSTER": "true",
            "RELIER_PARTITIONS": str(partitions),
        })  # fmt: skip
        return group

    def adopt(self, stoppable: object) -> None:
        """Stop ``stoppable`` (anything with ``stop()``) with the cluster."""
        self._stoppables.append(stoppable)

    def proxy_to_redis(self) -> BlackholeProxy:
        assert self.redis is not None
        proxy = BlackholeProxy(upstream_port=self.redis.port)
        self.proxies.append(proxy)
        return proxy.start()

    def process_env(self, redis_url: str | None = None) -> dict[str, str]:
        url = redis_url or self.redis_url
        return worker_env(url, {**FAST_ENV, **self.env})

    # -- workers: the supervisor ---------------------------------------------------------
    def start_worker(
        self,
        slot: str,
        redis_url: str | None = None,
        extra_env: Mapping[str, str] | None = None,
        wait: bool = True,
    ) -> CeleryWorker:
        """Start the next generation of ``slot`` (``w1``, then ``w1-2``, ...); with
        ``wait``, return once it consumes."""
        gen = self._generation.get(slot, 0) + 1
        self._generation[slot] = gen
        name = slot if gen == 1 else f"{slot}-{gen}"
        url = redis_url or self.redis_url
        env = {**FAST_ENV, **self.env, **(extra_env or {})}
        if redis_url is not None:  # through a proxy: relier, and the broker if it is Redis
            env["RELIER_REDIS_URL"] = url
            if self.rabbit is None:
                env["CELERY_BROKER_URL"] = url
        worker = CeleryWorker(
            redis_url=url,
            log_dir=self.log_dir,
            name=name,
            concurrency=self.concurrency,
            extra_env=env,
        )
        self.workers.append(worker)  # recorded before it runs: stop() reaches it
        self.slots[slot] = worker
        worker.start(wait=False)
        if wait:
            worker.wait_ready(90)
        return worker

    def start_worker_nowait(self, slot: str, **kwargs: object) -> CeleryWorker:
        return self.start_worker(slot, wait=False, **kwargs)  # type: ignore[arg-type]

    def start_workers(self, count: int) -> list[CeleryWorker]:
        return [self.start_worker(f"w{i + 1}") for i in range(count)]

    def replace(self, slot: str) -> CeleryWorker:
        """What a supervisor does when a worker died: start a fresh one in its slot."""
        return self.start_worker(slot)

    def slot_of(self, worker: CeleryWorker) -> str:
        return next(slot for slot, w in self.slots.items() if w is worker)

    def live_workers(self) -> list[CeleryWorker]:
        return [w for w in self.slots.values() if w.alive()]

    # -- the standalone resurrector --------------------------------------------------------
    def start_resurrector(self) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / "resurrector.log", "ab")  # noqa: SIM115 - closed in stop()
        self._resurrector_log = log
        self.resurrector = subprocess.Popen(
            [sys.executable, "manage.py", "relier_resurrector"],
            cwd=REPO_ROOT,
            env=self.process_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self.resurrector

    # -- teardown ------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop every process this cluster started, by PID; safe to call twice."""
        for proxy in self.proxies:
            with contextlib.suppress(Exception):
                proxy.heal()  # a cut-off worker's warm shutdown needs Redis, not a dead link
        threads = [
            threading.Thread(target=_stop_worker, args=(w,), daemon=True) for w in self.workers
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.workers.clear()
        if self.resurrector is not None:
            _stop_process(self.resurrector)
            self.resurrector = None
            self._resurrector_log.close()
        for proxy in self.proxies:
            proxy.stop()
        self.proxies.clear()
        for stoppable in self._stoppables:
            with contextlib.suppress(Exception):
                stoppable.stop()  # type: ignore[attr-defined]
        self._stoppables.clear()
        if self.rabbit is not None:
            self.rabbit.stop()
        if self.store_cluster is not None:
            self.store_cluster.stop()
        if self.redis is not None:
            self.redis.stop()
        with _live_lock:
            if self in _live:
                _live.remove(self)

    def log_paths(self) -> list[Path]:
        return sorted(self.log_dir.glob("*.log"))


def _stop_worker(worker: CeleryWorker) -> None:
    try:
        worker.stop()  # SIGCONT, SIGTERM with a deadline, then SIGKILL of its group
    except Exception:
        worker.kill()


def _stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.1):  # type: ignore[no-untyped-def]
    """``wait_until`` with the runner's default polling interval."""
    return wait_until(predicate, timeout_s, interval_s=interval_s, what=what)
