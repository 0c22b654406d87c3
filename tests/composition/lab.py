"""What the cells of the composition matrix share: the servers, the workers, the
lost-reply proxy, and the coordinators of the faults that touch more than one cell.

Workers (each also reads the recovery queue), on chaos-test timings (heartbeat TTL 2 s,
scan every 0.5 s, leader lease 2 s) and a queued grace (120 s) above every bound, so a
message only that grace would bring back shows as a failure:

- two on the default queue, where most cells run;
- ``lossy`` on ``compose.lossy``, whose store connection runs through the proxy: a
  lost-reply cell's scripts lose their replies there (the broker stays direct);
- ``doomed`` on ``compose.doomed``: ``coordinators.Killer`` SIGKILLs it (main process
  and pool at once) whenever it holds worker-killed cells' tasks, queues a task behind
  them in that instant, and restarts it, as a supervisor would;
- ``parked`` on ``compose.parked``, started by ``coordinators.Parked`` only once every
  cancel cell has made its cancels (until then nothing reads that queue, so a task
  waits there unstarted for as long as the test needs).

This process pushes through the proxy as well (store and broker), with the outbox on,
its default database being the one the workers share (PostgreSQL), so an outbox cell's
``transaction.atomic()`` writes the row a worker's relay can read. It observes the
store on a direct connection.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relier_django.core.dlq.entries import Summary
from relier_django.core.model import config
from relier_django.core.observe.audit import audit
from relier_django.core.store import scripts
from relier_django.core.store.keys import KeySpace
from testproject.celery import app
from testproject.demo.composition_tasks import booking_label, effect_key
from testproject.harness import CeleryWorker, RedisServer, process_pointed_at
from testproject.lostreply import Arming, LostReplyProxy
from testproject.shared_db import SharedDatabase
from tests.leaks import assert_no_leaked_keys

from .coordinators import Killer, Parked, PeriodicFirer
from .matrix import DEFAULT_QUEUE, DOOMED_QUEUE, LOSSY_QUEUE, PARKED_QUEUE

if TYPE_CHECKING:
    pass

QUEUED_GRACE_S = "120"
WORKER_ENV = {
    "RELIER_HEARTBEAT_TTL_S": "2",
    "RELIER_SCAN_INTERVAL_S": "0.5",
    "RELIER_LEADER_LEASE_S": "2",
    "RELIER_QUEUED_GRACE_S": QUEUED_GRACE_S,
    "RELIER_OUTBOX_GRACE_S": "1",
}
QUEUES = (DEFAULT_QUEUE, LOSSY_QUEUE, DOOMED_QUEUE, PARKED_QUEUE, "relier.recovery")
DROPPED = {"push": scripts.PUSH, "start": scripts.START, "commit": scripts.COMMIT}


@dataclass(frozen=True)
class State:
    """A task as the store holds it, read in one round trip."""

    record: dict[str, Any] | None  # its outcome record (rl:r)
    dlq: Summary | None
    exists: bool  # its task hash (unfinished)
    state: str | None
    fence: str | None
    queue: str | None
    worker: str | None  # the process running or holding it (a reserved message)


class Lab:
    def __init__(
        self, server: RedisServer, directory: Path, db: SharedDatabase, proxy: LostReplyProxy
    ) -> None:
        self.server, self.directory, self.db, self.proxy = server, directory, db, proxy
        # Every cell polls from a thread of its own: more than redis-py's default pool (100).
        self.redis = server.client(decode_responses=True, max_connections=2000)
        self.keys = KeySpace("rl")
        self.observe = config.current().replace(redis_url=server.url)  # a direct config
        self.steady = [self._worker(f"w{i}", DEFAULT_QUEUE) for i in (1, 2)]
        self.lossy = self._worker("lossy", LOSSY_QUEUE, RELIER_REDIS_URL=proxy.url)
        self.doomed = self._worker("doomed", DOOMED_QUEUE)
        self.parked_worker = self._worker("parked", PARKED_QUEUE, concurrency=1)
        self.stopping = threading.Event()  # the run is over or aborted: cells stop waiting
        self.killer = Killer(self)
        self.parked = Parked(self)
        self.periodic = PeriodicFirer(self)

    def _worker(self, name: str, queue: str, concurrency: int = 2, **env: str) -> CeleryWorker:
        return CeleryWorker(
            redis_url=self.server.url, log_dir=self.directory, name=name,
            concurrency=concurrency, queues=(queue,),
            extra_env={**WORKER_ENV, **self.db.env(), **env},
        )  # fmt: skip

    @property
    def workers(self) -> list[CeleryWorker]:
        return [*self.steady, self.lossy, self.doomed, self.parked_worker]

    @classmethod
    @contextlib.contextmanager
    def running(cls, server: RedisServer, directory: Path, db: SharedDatabase) -> Iterator[Lab]:
        with LostReplyProxy(server.url) as proxy:
            lab = cls(server, directory, db, proxy)
            producer = {
                "RELIER_REDIS_URL": proxy.url, "CELERY_BROKER_URL": proxy.url,
                "RELIER_OUTBOX": "1", "RELIER_QUEUED_GRACE_S": QUEUED_GRACE_S,
            }  # fmt: skip
            try:
                for worker in [*lab.steady, lab.lossy, lab.doomed]:
                    worker.start(wait=False)
                for worker in [*lab.steady, lab.lossy, lab.doomed]:
                    worker.wait_ready()
                with (
                    process_pointed_at(producer),
                    default_database(db.url),
                    relier_result_backend(),
                ):
                    lab.killer.start()
                    yield lab
            finally:
                lab.stopping.set()
                lab.killer.stop()
                lab.parked.stop()
                for worker in lab.workers:
                    worker.kill()
        assert not proxy.protocol_errors, f"the proxy met malformed RESP: {proxy.protocol_errors}"

    # --- reading the store (directly) ----------------------------------------------
    def state(self, task_id: str) -> State:
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(self.keys.result(task_id))
        pipe.hmget(self.keys.task(task_id), "state", "fence", "queue", "worker")
        pipe.hgetall(self.keys.dlq_entry(task_id))
        record, (state, fence, queue, worker), entry = pipe.execute()
        return State(
            json.loads(record) if record else None,
            Summary.from_fields(task_id, entry) if entry else None,
            state is not None, state, fence, queue, worker,
        )  # fmt: skip

    def queues_holding(self, task_id: str) -> list[str]:
        """The broker queues whose messages name ``task_id`` (in their headers)."""
        return [q for q in QUEUES if any(task_id in m for m in self.redis.lrange(q, 0, -1))]

    def running_at(self, run: Any) -> bool:
        """``run``'s incarnation is the one running its task now."""
        state, fence = self.redis.hmget(self.keys.task(run.task_id), "state", "fence")
        return state == "running" and fence == str(run.fence)

    def task_state(self, task_id: str) -> str | None:
        return self.redis.hget(self.keys.task(task_id), "state")

    def dlq_summary(self, task_id: str) -> Summary | None:
        return self.state(task_id).dlq

    def in_outbox(self, task_id: str) -> bool:
        return bool(self.db.query("SELECT 1 FROM relier_outbox WHERE task_id = %s", [task_id]))

    def is_pool_process(self, pid: int) -> bool:
        """A pool process of a worker this lab started (and so, one it may signal)."""
        return any(pid == child.pid for w in self.workers for child in w.children())

    def effects(self, label: str, task_id: str, atomic: bool) -> list[int]:
        """The fences whose run of ``task_id`` (called with ``label``) made its effect:
        a ``Booking`` row for the inbox's tasks, an entry in Redis for the others."""
        if atomic:
            rows = self.db.query(
                "SELECT fence FROM demo_booking WHERE label = %s", [booking_label(label, task_id)]
            )
            return sorted(fence for (fence,) in rows)
        made = self.redis.lrange(effect_key(label), 0, -1)
        return sorted(int(f) for t, f in (e.rsplit(":", 1) for e in made) if t == task_id)

    def arm_lost_replies(self, task_id: str) -> dict[str, Arming]:
        """Each of push.lua, start.lua and commit.lua loses its reply once for the task."""
        first = self.keys.task(task_id)
        return {name: self.proxy.drop_reply(s.sha, first_key=first) for name, s in DROPPED.items()}

    # --- after the campaign ---------------------------------------------------------
    def leftovers(self, quiet_s: float = 20.0) -> list[str]:
        """What is left once the cells ended (waited for up to ``quiet_s``): work in
        flight, queued messages, outbox rows, keys G7 does not allow."""
        deadline, found = time.monotonic() + quiet_s, ["(not read)"]
        while found and time.monotonic() < deadline:
            found = self._in_flight()
            time.sleep(0.5)
        try:
            assert_no_leaked_keys(self.redis, self.keys)
        except AssertionError as leaked:
            found.append(str(leaked))
        # relier_audit's evidence: every push of the campaign explained (issue 40).
        checked = audit(self.redis, self.keys, 0, slack_ms=5000, limit=10)
        if not checked.noted:  # the check is not vacuous: every campaign pushes
            found.append("relier_audit: the ledger noted none of the campaign's pushes")
        if checked.unexplained:
            found.append(f"relier_audit: {checked.unexplained} unexplained: "
                         f"{[u.to_json() for u in checked.unexplained_ids]}")  # fmt: skip
        return found

    def _in_flight(self) -> list[str]:
        found = []
        for name, key in (("expiry index", self.keys.expiry), ("schedule", self.keys.schedule)):
            if members := self.redis.zrange(key, 0, 9):
                found.append(f"{name}: {members}")
        for queue in QUEUES:
            if depth := self.redis.llen(queue):
                found.append(f"queue {queue}: {depth} message(s)")
        if rows := self.db.query("SELECT task_id FROM relier_outbox"):
            found.append(f"outbox rows: {[r[0] for r in rows][:10]}")
        return found


@contextlib.contextmanager
def default_database(url: str) -> Iterator[None]:
    """This process's default database is ``url`` (the workers' database) meanwhile:
    Celery's canvas pushes wait for the default database's transaction."""
    import environ
    from django.conf import settings
    from django.db import connections

    def point(value: dict[str, Any]) -> None:
        connections.close_all()
        settings.DATABASES["default"] = value
        connections.settings = connections.configure_settings(settings.DATABASES)
        with contextlib.suppress(AttributeError):
            del connections["default"]

    before = settings.DATABASES["default"]
    point(environ.Env.db_url_config(url))
    try:
        yield
    finally:
        point(before)


@contextlib.contextmanager
def relier_result_backend() -> Iterator[None]:
    """Celery asks a result backend to start a chord: relier's, meanwhile."""
    before = app.conf.result_backend

    def use(name: str | None) -> None:
        app.conf.result_backend = name
        app._backend_cache = None  # Celery keeps the backend built: drop it
        vars(app._local).pop("backend", None)

    use("relier_django.results:RelierBackend")
    try:
        yield
    finally:
        use(before)
