"""What the cells of the composition matrix share: the servers, the workers, the
lost-reply proxy, and the coordinators of the faults that touch more than one cell.

Workers (each also reads the recovery queue), on chaos-test timings (heartbeat TTL 2 s,
scan every 0.5 s, leader lease 2 s) and a queued grace (120 s) above every bound, so a
message only that grace would bring back shows as a failure:

- two on the default queue, where most cells run;
- ``lossy`` on ``compose.lossy``, whose store connection runs through the proxy: a
  lost-reply cell's scripts lose their replies there (the broker stays direct);
- ``doomed`` on ``compose.doomed``: :class:`Killer` SIGKILLs it (main process and pool
  at once) whenever it holds worker-killed cells' tasks, queues a task behind them in
  that instant, and restarts it, as a supervisor would;
- ``parked`` on ``compose.parked``, started by :class:`Parked` only once every cancel
  cell has made its cancels (until then nothing reads that queue, so a task waits
  there unstarted for as long as the test needs).

This process pushes through the proxy as well (store and broker), with the outbox on,
its default database being the one the workers share (PostgreSQL), so an outbox cell's
``transaction.atomic()`` writes the row a worker's relay can read. It observes the
store on a direct connection.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relier_django.core.dlq.entries import Summary
from relier_django.core.model import config
from relier_django.core.schedule import periodic
from relier_django.core.store import scripts
from relier_django.core.store.keys import KeySpace
from testproject.celery import app
from testproject.demo.composition_tasks import booking_label, effect_key
from testproject.harness import CeleryWorker, RedisServer, process_pointed_at
from testproject.lostreply import Arming, LostReplyProxy
from testproject.shared_db import SharedDatabase
from tests.leaks import assert_no_leaked_keys

from .matrix import DEFAULT_QUEUE, DOOMED_QUEUE, LOSSY_QUEUE, PARKED_QUEUE

if TYPE_CHECKING:
    from .case import Case

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
        self.redis = server.client(decode_responses=True)
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


class _Coordinator:
    """A daemon thread of the lab's, over the cases that joined it."""

    POLL_S = 0.2

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.cases: set[Case] = set()
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=type(self).__name__, daemon=True)
        self.errors: list[BaseException] = []

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        if self.thread.is_alive():
            self.thread.join(60)

    def join(self, case: Case) -> None:
        with self.lock:
            self.cases.add(case)

    def members(self) -> list[Case]:
        with self.lock:
            return list(self.cases)

    def _loop(self) -> None:
        try:
            while not self.stopped.wait(self.POLL_S):
                self.step()
        except BaseException as error:  # reported with the campaign's leftovers
            self.errors.append(error)

    def step(self) -> None:
        raise NotImplementedError


class Killer(_Coordinator):
    """SIGKILLs the doomed worker whenever it holds worker-killed cells' first
    incarnations, then restarts it. It waits up to ``FILL_S`` for the worker's pool to
    fill and for it to have taken every message of its queue (it then waits for more,
    blocked reading the queue), and in the instant of the kill queues one task for each
    cell behind them."""

    FILL_S = 1.5
    MAX_ROUNDS = 60
    # Cells in the worker at once: few enough that it takes every message of its
    # queue before a kill (so it waits reading the queue when it dies).
    MAX_CELLS = 3
    rounds = 0

    def join(self, case: Case) -> None:
        with self.lock:
            while len(self.cases) >= self.MAX_CELLS and not self.stopped.is_set():
                self.lock.release()
                time.sleep(self.POLL_S)
                self.lock.acquire()
            self.cases.add(case)

    def leave(self, case: Case) -> None:
        with self.lock:
            self.cases.discard(case)

    def _holding(self) -> list[tuple[Case, Any]]:
        pids = {child.pid for child in self.lab.doomed.children()}
        return [(case, run) for case in self.members() for run in case.holding() if run.pid in pids]

    def step(self) -> None:
        holding = self._holding()
        if not holding:
            return
        if self.rounds >= self.MAX_ROUNDS:
            raise RuntimeError(f"{self.rounds} kills and the doomed worker still holds {holding}")
        filled = time.monotonic() + self.FILL_S
        while time.monotonic() < filled and (
            len(holding) < self.lab.doomed.concurrency or self.lab.redis.llen(DOOMED_QUEUE)
        ):
            time.sleep(self.POLL_S)
            holding = self._holding()
        doomed, cases = self.lab.doomed, sorted(self.members(), key=lambda c: c.label)
        cases = cases[self.rounds % len(cases) :] + cases[: self.rounds % len(cases)]
        inside = {case: case.in_worker(doomed.hostname) for case in cases}
        os.killpg(doomed.pid, signal.SIGKILL)  # the main process and its pool, at once
        # In that instant, a task is queued behind them for each cell (its worker may
        # still be blocked reading that queue), as a producer would: G15 says it runs
        # within the death-detection bound, not after QUEUED_GRACE_S.
        self.rounds += 1
        behind = [case.queue_behind(self.rounds) for case in cases]
        doomed.kill()  # and reaped
        for case, run in holding:
            case.killed.add(run.key)
        for case, task_id in zip(cases, behind, strict=True):
            case.killed.update(inside[case])
            held = [case.role_of(k.rsplit(":", 1)[0]) for k in inside[case]] or "none"
            case.touch(
                f"SIGKILLed worker {doomed.name} (kill {self.rounds}), which held {held} of "
                f"the cell's tasks; queued {task_id} in that instant"
            )
        doomed.start()  # as a supervisor would
        for case in self.members():
            case.touch(f"restarted worker {doomed.name} (pid {doomed.pid})")


class Parked(_Coordinator):
    """Starts the parked queue's worker once every cancel cell has made its cancels
    (``expect`` of them), or ``MAX_WAIT_S`` after the first joined."""

    MAX_WAIT_S = 60.0

    def __init__(self, lab: Lab) -> None:
        super().__init__(lab)
        self.expected = 0
        self.done: set[Case] = set()
        self.since: float | None = None

    def expect(self, count: int) -> None:
        self.expected = count
        if count:
            self.start()

    def join(self, case: Case) -> None:
        super().join(case)
        self.since = self.since or time.monotonic()

    def leave(self, case: Case) -> None:
        with self.lock:
            self.done.add(case)

    def step(self) -> None:
        with self.lock:
            ready = len(self.done) >= self.expected
        if not ready and (self.since is None or time.monotonic() < self.since + self.MAX_WAIT_S):
            return
        worker = self.lab.parked_worker
        worker.start()
        for case in self.members():
            case.touch(f"started worker {worker.name} on the parked queue")
        self.stopped.set()


class PeriodicFirer:
    """Fires one entry's ticks as a scanner does (``fire_due``), one tick per call:
    the app's ``beat_schedule`` is this process's, so one entry is put there at a
    time. The ticks are whole seconds just past, so each is due at once."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def firing(self, entry: str, spec: dict[str, Any]) -> Iterator[int]:
        """Yields the next tick of ``entry`` (its task id can be armed), then fires it."""
        redis_, keys = self.lab.redis, self.lab.keys
        last = redis_.hget(keys.periodic, entry)
        if last is None:  # its first tick: a second ago; the entry seen since before
            seconds, _ = redis_.time()
            tick = (int(seconds) - 1) * 1000
            redis_.hset(keys.periodic, entry, tick - 1000)
        else:
            tick = int(last) + 1000
        yield tick
        with self.lock:
            before = app.conf.beat_schedule
            app.conf.beat_schedule = {entry: spec}
            try:
                periodic.fire_due(app, config.current(), tick)
            finally:
                app.conf.beat_schedule = before
