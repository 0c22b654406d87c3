"""The lab's coordinators: the faults and the firing that more than one cell shares.

- :class:`Killer`: the whole-worker kills of the doomed worker;
- :class:`Parked`: the start of the parked queue's worker, once every cancel is made;
- :class:`PeriodicFirer`: one periodic entry's tick at a time, as a scanner fires it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from relier_django.core.model import config
from relier_django.core.schedule import periodic
from testproject.celery import app

from .matrix import DOOMED_QUEUE

if TYPE_CHECKING:
    from .case import Case
    from .lab import Lab


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

    def __init__(self, lab: Lab) -> None:
        super().__init__(lab)
        # Held from a kill to the restart after it: a cell that leaves waits for it, so
        # the task queued for it in the kill's instant is one it follows and waits for.
        self.acting = threading.Lock()

    def leave(self, case: Case) -> None:
        with self.acting, self.lock:
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
        with self.acting:
            self._kill()

    def _kill(self) -> None:
        holding = self._holding()
        doomed, cases = self.lab.doomed, sorted(self.members(), key=lambda c: c.label)
        if not holding or not cases:  # they left while the pool filled
            return
        cases = cases[self.rounds % len(cases) :] + cases[: self.rounds % len(cases)]
        inside = {case: case.in_worker(doomed.hostname) for case in cases}
        os.killpg(doomed.pid, signal.SIGKILL)  # the main process and its pool, at once
        # In that instant, a task is queued behind them for each cell (its worker may
        # still be blocked reading that queue), as a producer would: G15 says it runs
        # within the death-detection bound, not after QUEUED_GRACE_S.
        self.rounds += 1
        behind = [case.queue_behind(self.rounds) for case in cases]
        doomed.kill()  # and reaped
        for case in cases:
            # And what it was taking as it died: take.lua marks a task held by its taker
            # as it pops the message, so the mark shows until the death check hands it
            # off (a second later), though the reply never reached the worker.
            inside[case] = sorted({*inside[case], *case.in_worker(doomed.hostname)})
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
