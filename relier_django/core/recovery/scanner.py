"""The scanner: the leader-elected loop that runs the resurrector's passes and
dispatches the schedule's due tasks.

Every worker's main process runs one (``EMBEDDED_RESURRECTOR``), and so does
``manage.py relier_resurrector``; ``leader.lua`` lets one of them lead at a time. The
leader runs a resurrector pass every ``SCAN_INTERVAL_S``, and at once when a check
(every ``deaths.CHECK_S``) finds a holder dead or a deadline just passed (a hand-off, a
heartbeat TTL); between passes it sleeps until the earliest scheduled task is due
(``schedule.dispatch``). After each of its passes it runs the leader duties a layer
above registered (``add_leader_duty``: the Django layer's outbox relay).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from ..model.config import Config
from ..schedule import periodic
from ..schedule.dispatch import Dispatcher
from ..store import handover, liveness, scripts
from ..store.connection import home_client, refresh_home
from . import deaths, inflight
from .resurrector import PassReport, Resurrector

logger = logging.getLogger("relier_django.resurrector")

# Longest single block on the wake-up list: below any sane socket timeout.
_MAX_BLOCK_S = 1.0
# Shortest: a task overdue but not taken yet is retried after this, not in a busy loop.
_MIN_BLOCK_S = 0.005
# Below this, wait on the local clock (see _sleep): more than one Redis clock tick.
_LOCAL_WAIT_S = 0.15
# Below this, a wait for a check or a pass is not worth a round trip.
_MIN_WAKE_WAIT_S = 0.02
# "Nothing scheduled": no due time to dispatch at before the next read of the heads.
_NEVER_S = 365 * 24 * 3600.0
# Errors that mean the store is away for now, not that a step is wrong.
_AWAY = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
)
# How long a death stays in a scanner's memory, for it to act on once it leads.
_DEATH_MEMORY_S = 60.0


LeaderDuty = Callable[[Any], Callable[[], object]]
"""``duty(app)`` makes the step the leader runs after every pass (errors are logged)."""

_duties: list[tuple[str, LeaderDuty]] = []


def add_leader_duty(name: str, duty: LeaderDuty) -> None:
    """Have every scanner made from now on run ``duty(app)()`` after each pass it leads.
    The same name twice keeps one (``AppConfig.ready()`` may run more than once)."""
    _duties[:] = [(n, d) for n, d in _duties if n != name]
    _duties.append((name, duty))


class Scanner:
    """Runs resurrector passes and dispatches due scheduled tasks while it holds the
    leader lease."""

    def __init__(self, app: Any, config: Config, scanner_id: str) -> None:
        self.app = app
        self.resurrector = Resurrector(app, config, scanner_id)
        self.dispatcher = Dispatcher(app, config, scanner_id)
        self.config = config
        self.scanner_id = scanner_id
        self._stop = threading.Event()
        self._leads = False  # as of the last pass
        self.deaths = deaths.Deaths(home_client(config), self.resurrector.keys)
        # One reading of the Redis clock for both (store/clock.py).
        self.dispatcher.clock = self.deaths.clock
        # Holders found dead and not handed off yet (by this scanner, once it leads):
        # worker -> (its last sign of life, Redis ms; when this scanner found it).
        self._dead: dict[str, tuple[int, float]] = {}
        self._due_seen_ms: int | None = None  # Redis ms of the leader's last due check
        # When (monotonic) the earliest scheduled task is due, as the leader's last wait
        # read it; 0.0: unknown, dispatch at the next turn.
        self._due_at = 0.0
        self.duties = [(name, make(app)) for name, make in _duties]

    def is_leader(self) -> bool:
        """Acquire or extend the lease; True while this scanner holds it."""
        keys = self.resurrector.keys
        ttl_ms = int(self.config.leader_lease_ttl_s * 1000)
        return scripts.ScriptCall(
            scripts.LEADER, keys.for_leader(), [self.scanner_id, ttl_ms], lambda r: bool(int(r))
        ).run(self.resurrector.client)

    def release(self) -> None:
        keys = self.resurrector.keys
        scripts.ScriptCall(
            scripts.LEADER_RELEASE, keys.for_leader(), [self.scanner_id], lambda r: bool(int(r))
        ).run(self.resurrector.client)

    def tick(self) -> PassReport | None:
        """One pass: due scheduled tasks are dispatched, then, if this scanner leads,
        expired ones are resurrected; None when it does not lead. A scanner that saw a
        live leader at its last check leaves both to it; any other dispatches too (each
        task is taken once), so a dead or stalled leader's are sent within a pass."""
        if not self._leads and self.deaths.watching:
            return None  # the lease is a live leader's, seen at the last check
        self._guarded(self.dispatcher.run_due, "scheduled dispatch")
        leads = self.is_leader()
        if leads and not self._leads:
            self.dispatcher.forget()
        if not leads:
            return None
        report = self.resurrector.run_pass()
        if self.resurrector.keys.tagged:
            self._guarded(self._sweep_handovers, "hand-over sweep")
        for name, duty in self.duties:
            self._guarded(duty, name)
        return report

    def run(self, interval_s: float | None = None, once: bool = False) -> None:
        """Scan until :meth:`stop` (or once). Errors are logged; the loop goes on.

        The leader sleeps until the next scheduled task is due when that comes before
        the next pass (woken early by a push that makes a new earliest due time), and
        dispatches it then; the resurrector keeps its interval."""
        interval = self.config.scan_interval_s if interval_s is None else interval_s
        # This scanner's own death is seen as any holder's: a leader that dies is
        # replaced within a check, not after its lease.
        liveness.hold(self.config, self.scanner_id)
        try:
            next_pass = next_check = next_fire = 0.0
            while True:
                if time.monotonic() >= next_check:
                    # A follower watching a live leader looks less often: only the
                    # leader's own processes' deaths wait for it (docs/scaling.md).
                    watching = not self._leads and self.deaths.watching
                    next_check = time.monotonic() + (deaths.WATCH_S if watching else deaths.CHECK_S)
                    if self._guarded(self.check_deaths, "death check") or (
                        self._leads and self._guarded(self._newly_due, "due check")
                    ):
                        next_pass = 0.0  # a death, or a deadline that just passed
                if time.monotonic() >= next_pass:
                    next_pass = time.monotonic() + interval
                    self._leads = self._guarded(self.tick, "resurrector pass") is not None
                elif self._leads and time.monotonic() >= self._due_at:
                    # Only when the earliest due time read last has come: _sleep reads
                    # it before every wait, a push's new earliest one included.
                    self._guarded(self.dispatcher.run_due, "scheduled dispatch")
                # Every scanner fires periodic ticks (each tick is claimed, so it fires
                # once): the leader on time, the others once a pass (within a pass if
                # it died), not at every check: an idle follower's commands stay few.
                tick_in = None
                if self._leads or time.monotonic() >= next_fire:
                    next_fire = time.monotonic() + interval
                    tick_in = self._guarded(self._fire_periodic, "periodic ticks")
                wake = min(next_pass, next_check) - time.monotonic()
                if once or self._sleep(max(0.0, wake), tick_in):
                    return
        finally:
            try:
                self.release()
            except Exception:
                logger.warning("could not release the leader lease", exc_info=True)

    def check_deaths(self) -> int:
        """List the live holders; if this scanner leads (or takes the lease from a dead
        leader), hand off the tasks of the holders found dead. Returns how many."""
        now = time.monotonic()
        if self.config.cluster:
            # The liveness connections follow the home master through a failover.
            self.deaths.client = home_client(self.config)
        try:
            # A scanner that does not lead watches the leader alone (deaths.py).
            newly_dead = self.deaths.check(watch=not self._leads, leading=self._leads)
        except redis.ConnectionError:
            refresh_home(self.config)  # the home master may have failed over
            raise
        for worker, seen_ms in newly_dead.items():
            logger.warning("holder found dead (its connection is gone) worker=%s", worker)
            self._dead[worker] = (seen_ms, now)
        for worker, (_, found) in list(self._dead.items()):
            if now - found > _DEATH_MEMORY_S:
                del self._dead[worker]
        if not self._dead:
            return 0
        if not self._leads:
            leader = self.resurrector.client.get(self.resurrector.keys.leader)
            if leader not in self._dead:
                return 0
            # The leader died: its lease is released now, not after LEADER_LEASE_S.
            scripts.ScriptCall(
                scripts.LEADER_RELEASE, self.resurrector.keys.for_leader(), [str(leader)],
                lambda r: bool(int(r)),
            ).run(self.resurrector.client)  # fmt: skip
            self._leads = self.is_leader()
            if not self._leads:
                return 0
            self.dispatcher.forget()
            logger.warning("took the leader lease from dead scanner=%s", leader)
        keys, client = self.resurrector.keys, self.resurrector.client
        held = deaths.held_by(client, keys, {w: seen for w, (seen, _) in self._dead.items()})
        handed = deaths.hand_off(keys, held).run(client) if held else 0
        self._put_back(list(self._dead))
        self.deaths.forget(self._dead)
        if held:
            logger.warning(
                "handed off %s task(s) of %s dead holder(s) for resurrection",
                handed, len(self._dead),
            )  # fmt: skip
        self._dead.clear()
        return handed

    def _put_back(self, workers: list[str]) -> None:
        """The messages the dead workers took and had not registered, back in their
        queues (a Redis broker apart from the store keeps copies of them:
        ``recovery/inflight.py``)."""
        try:
            inflight.restore(self.app, workers)
        except Exception:
            # Their tasks are still found: the ones marked held by the hand-off above,
            # the rest by their queued grace.
            logger.warning(
                "could not put back the messages taken by dead worker(s) %s", workers,
                exc_info=True,
            )  # fmt: skip

    def _sweep_handovers(self) -> int:
        # Partitioned stores only: the hand-overs a worker did not complete after its
        # commit (it died, or its calls failed), store/handover.py.
        return handover.sweep(self.resurrector.client, self.resurrector.keys,
                              self.deaths.clock.now_ms())  # fmt: skip

    def _newly_due(self) -> bool:
        """True when a deadline passed since the last check (a hand-off, a TTL)."""
        due, self._due_seen_ms = self.resurrector.newly_due(
            self._due_seen_ms, self.deaths.clock.now_ms()
        )
        return due

    def _guarded(self, step: Any, what: str) -> Any:
        try:
            return step()
        except _AWAY as exc:
            # Redis away (a restart, a failover): the step is retried at its next turn,
            # and a traceback per step per turn would bury the one line that matters.
            logger.warning("%s failed scanner=%s: %r", what, self.scanner_id, exc)
            return None
        except Exception:
            logger.exception("%s failed scanner=%s", what, self.scanner_id)
            return None

    def _fire_periodic(self) -> float:
        """Fire the due periodic ticks; seconds until the next one."""
        now_ms = self.dispatcher.now_ms()
        return max(0.0, (periodic.fire_due(self.app, self.config, now_ms) - now_ms) / 1000)

    def _sleep(self, until_pass_s: float, tick_in_s: float | None = None) -> bool:
        """Sleep until the next pass, or, if this scanner leads, the next due scheduled
        task or periodic tick when that comes first; True once stopped."""
        if not self._leads:
            return self._stop.wait(until_pass_s)
        try:
            self._due_at = 0.0
            due_in = self.dispatcher.next_due_in_s()
            self._due_at = time.monotonic() + (due_in if due_in is not None else _NEVER_S)
            due = min((t for t in (due_in, tick_in_s) if t is not None), default=None)
            if due is not None and due <= until_pass_s:
                if due <= _LOCAL_WAIT_S:
                    # Redis ends a blocking wait only on its clock tick (100 ms at hz
                    # 10): the last stretch before a due time is waited here, to the ms.
                    return self._stop.wait(max(due, _MIN_BLOCK_S))
                # Bounded by the client's socket timeout, and short enough that stop()
                # is seen within a pass; woken early by a push with a new earliest due
                # time.
                self.dispatcher.wait(min(due - _LOCAL_WAIT_S, _MAX_BLOCK_S))
            elif until_pass_s <= _MIN_WAKE_WAIT_S:
                return self._stop.wait(until_pass_s)
            else:
                # Next comes a death check or a pass, which need no precision: wait on
                # the wake-up list all the same, so that a task made due now (a freed
                # slot handed over, a limited push with a free one) is dispatched at
                # once instead of after the local wait (up to 150 ms, every 250 ms).
                # Redis may end it up to a clock tick late: a check a little late.
                self.dispatcher.wait(min(until_pass_s, _MAX_BLOCK_S))
        except Exception:
            logger.warning("waiting for scheduled tasks failed", exc_info=True)
            return self._stop.wait(until_pass_s)
        return self._stop.is_set()

    def stop(self) -> None:
        self._stop.set()

    def start_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="relier-resurrector", daemon=True)
        thread.start()
        return thread
