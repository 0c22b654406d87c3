"""Periodic tasks: the ``beat_schedule`` entries that name an ``@rl_task``, each tick
fired exactly once by whichever scanners run (G11).

A tick is named by (entry name, tick time): for an interval of N seconds the tick times
are the multiples of N since the epoch; for a ``crontab``, its own fire times in the
app's timezone. ``fire_due`` (called by the scanner every pass) fires each entry's due
ticks in order, each in three steps:

1. ``tick.lua`` claims the tick: refused if the entry's last recorded tick is at or past
   it, or while another caller's claim is live. The claim is a lease.
2. the claimer pushes the task with a task id derived from (entry, tick) and
   ``eta`` = the tick (so ``ctx.scheduled_at`` is the tick time).
3. ``tick_done.lua`` records the tick and drops the claim.

Decision: the push's task id, not the claim, is the tick's record of having fired.
``push.lua`` refuses a second task with an id that exists, whose outcome is kept
(``RESULT_TTL_S``) or that names a DLQ entry. So a scanner killed after step 1 leaves a
claim that runs out after ``RESURRECT_LEASE_S`` and the next scanner takes it over and
pushes the same tick (which nobody pushed: it runs once); one killed after step 2
leaves the same claim, and the takeover's push finds the task (still once). No window
loses a tick or fires it twice; only a scanner that stalls for longer than its lease
between its claim and its push is told not to push (it checks its own clock first).
(This holds while a tick's outcome outlives its claim: ``RESULT_TTL_S`` well above
``RESURRECT_LEASE_S``, as the defaults are.) Advancing the periodic state inside
``push.lua`` would widen every push for one caller; the derived id gives the same
exactly-once with two scripts of its own (docs/scheduling.md: the argument, and the
tests that kill a scanner between the steps).

Decision: a tick is a push of its own, whatever the task's idempotency. An idempotent
task's key is derived from its arguments, which are the same at every tick of an entry:
under that key every tick after the first would be answered "duplicate" for as long as
the first one's outcome is kept (``RESULT_TTL_S``, a day) and never run, and a direct
push of the same arguments would be taken for a tick. So each tick of an idempotent
task is pushed under a key of its own, :func:`tick_key` (entry, tick), which no other
push shares: ticks never deduplicate onto each other nor onto direct pushes, and a
tick pushed twice (a claim taken over) still runs once. To keep runs of an entry from
overlapping, make the task check its own state (or take ``relier_django.lock``).

Missed ticks (the scanners were down): the entry's ``options["relier_missed"]``:
``"all"`` (default) fires every missed tick, the newest ``CATCH_UP_LIMIT`` at most;
``"once"`` fires the newest one; ``"skip"`` fires only ticks that are on time (late by
less than one leader lease plus a scan interval). Skipped ticks are always logged with
their count, at WARNING.

Sources beside ``beat_schedule`` (:func:`add_source`: django-celery-beat's table, read by
the Django layer) hand entries of the same shape, read at every pass, so an edit takes
effect within a scan. Decision: an edited entry keeps its name, so its state (the last
recorded tick) carries over and tick.lua refuses every tick at or before it: whatever the
new schedule, no tick time fires twice. Such an entry also carries
``options["relier_since_ms"]`` (its last change): ticks at or before it are not fired, so
an entry edited, re-enabled or re-created under an old name starts at its next tick
instead of catching up ticks from before the change. A name in two sources is fired from
the first only (``beat_schedule``), the other rejected (``Problem.NAME_TAKEN``).
"""

from __future__ import annotations

import enum
import hashlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..broker import publish
from ..model import arguments
from ..model.config import Config, current
from ..model.envelope import decode
from ..model.errors import AdmissionRejected, DuplicateTaskId
from ..model.options import call_flow
from ..model.spec import TaskSpec
from ..model.timing import Timing
from ..push import producer
from ..store import scripts
from ..store.connection import sync_client
from ..store.keys import KeySpace
from .ticks import CATCH_UP_LIMIT, Missed, Schedule, parse_schedule, plan

logger = logging.getLogger("relier_django.periodic")

MISSED_OPTION = "relier_missed"
"""The key of an entry's ``options`` naming its missed-tick policy (``ticks.Missed``)."""
SINCE_OPTION = "relier_since_ms"
"""The key of an entry's ``options``: epoch ms at or before which no tick is fired."""
BEAT_SCHEDULE = "beat_schedule"
"""The name of the settings' source, in :class:`Rejected`."""
# What fire_due answers when there is no entry: the caller's own pace decides.
_IDLE_MS = 60_000


@dataclass(frozen=True, slots=True)
class Entry:
    """One ``beat_schedule`` entry that relier fires."""

    name: str
    task: str
    schedule: Schedule
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] | None = None
    queue: str | None = None
    missed: Missed = Missed.ALL
    since_ms: int | None = None  # no tick at or before it (options["relier_since_ms"])
    # options["limit"], options["concurrency_key"]: its ticks' own flow control.
    flow: tuple[str | None, str | None] = (None, None)


Source = Callable[[], Mapping[str, Any]]
"""Entries beside ``beat_schedule``, name to a dict of the same shape. Called at every
pass of every scanner: it must be cheap, and never raise while it can answer the last
entries it read (a source whose read raises has no entry fired in that pass)."""

_sources: dict[str, Source] = {}


def add_source(where: str, source: Source) -> None:
    """Fire ``source``'s entries too; ``where`` names it in logs and checks. Adding a
    source under a name already added replaces it."""
    _sources[where] = source


def remove_source(where: str) -> None:
    _sources.pop(where, None)


class Problem(enum.StrEnum):
    """Why an entry is not fired by relier (``manage.py check`` reports each)."""

    UNKNOWN_TASK = "unknown_task"
    BAD_SCHEDULE = "bad_schedule"
    BAD_ENTRY = "bad_entry"  # args, kwargs, options or the missed policy
    NOT_RELIER = "not_relier"  # a plain Celery task: celery beat's job
    NAME_TAKEN = "name_taken"  # an earlier source has an entry of that name
    SOURCE_FAILED = "source_failed"  # the source itself raised: none of its entries


@dataclass(frozen=True, slots=True)
class Rejected:
    entry: str
    problem: Problem
    detail: str
    where: str = BEAT_SCHEDULE


def read_entries(app: Any, sources: bool = True) -> tuple[list[Entry], list[Rejected]]:
    """The app's ``beat_schedule`` and every added source's entries: the entries relier
    fires, and the others with why.

    Args:
        app: the Celery app (its tasks already imported).
        sources: False reads ``beat_schedule`` alone (no I/O: the system checks).

    Returns:
        (entries naming an ``@rl_task`` with a valid schedule, every other entry).
    """
    entries: list[Entry] = []
    rejected: list[Rejected] = []
    seen: dict[str, str] = {}
    read: list[tuple[str, Source]] = [(BEAT_SCHEDULE, lambda: app.conf.beat_schedule or {})]
    if sources:
        read.extend(_sources.items())
    for where, source in read:
        try:
            raws = dict(source())
        except Exception as exc:
            detail = f"reading it raised {type(exc).__name__}: {exc}"
            rejected.append(Rejected("*", Problem.SOURCE_FAILED, detail, where))
            continue
        for name, raw in raws.items():
            name = str(name)
            if name in seen:
                detail = f"the name is taken by an entry in {seen[name]}, which is fired instead"
                rejected.append(Rejected(name, Problem.NAME_TAKEN, detail, where))
                continue
            seen[name] = where
            try:
                entries.append(_entry(app, name, raw))
            except _Reject as exc:
                rejected.append(Rejected(name, exc.problem, str(exc), where))
            except Exception as exc:  # one entry's fault is that entry's alone
                # Anything else an entry's values raise (a key function, a mapping that
                # fails to read) rejects that entry, reported like the others, never the
                # whole schedule: the scanner fires every entry from this list.
                detail = f"reading it raised {type(exc).__name__}: {exc}"
                rejected.append(Rejected(name, Problem.BAD_ENTRY, detail, where))
    return entries, rejected


class _Reject(Exception):
    def __init__(self, problem: Problem, detail: str) -> None:
        super().__init__(detail)
        self.problem = problem


def _entry(app: Any, name: str, raw: Any) -> Entry:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("task"), str):
        raise _Reject(Problem.BAD_ENTRY, "an entry is a dict with a 'task' name")
    task = app.tasks.get(raw["task"])
    if task is None:
        raise _Reject(Problem.UNKNOWN_TASK, f"no task named {raw['task']!r} is registered")
    spec = getattr(task, "relier_spec", None)
    if not isinstance(spec, TaskSpec):
        raise _Reject(Problem.NOT_RELIER, f"{raw['task']!r} is not an @rl_task")
    try:
        schedule = parse_schedule(raw.get("schedule"), app.timezone)
    except ValueError as exc:
        raise _Reject(Problem.BAD_SCHEDULE, str(exc)) from None
    args, kwargs, options = raw.get("args") or (), raw.get("kwargs") or {}, raw.get("options") or {}
    if not (isinstance(args, list | tuple) and isinstance(kwargs, Mapping)):
        raise _Reject(Problem.BAD_ENTRY, "'args' must be a list or tuple, 'kwargs' a dict")
    if not isinstance(options, Mapping):
        raise _Reject(Problem.BAD_ENTRY, "'options' must be a dict")
    if raw.get("one_off"):
        # A one-off run is a push with an eta (or django-celery-beat's own beat): an
        # entry that must switch itself off after firing has no state relier keeps.
        raise _Reject(Problem.BAD_ENTRY, "a one_off entry is not fired by relier")
    since = options.get(SINCE_OPTION)
    if since is not None and (not isinstance(since, int) or isinstance(since, bool)):
        raise _Reject(Problem.BAD_ENTRY, f"'{SINCE_OPTION}' must be epoch ms, an int")
    try:
        missed = Missed(options.get(MISSED_OPTION, Missed.ALL))
        arguments.check(spec, tuple(args), dict(kwargs))
        flow = _flow(spec, options, name)
    except (ValueError, TypeError) as exc:
        raise _Reject(Problem.BAD_ENTRY, str(exc)) from None
    queue = options.get("queue")
    return Entry(
        name,
        raw["task"],
        schedule,
        tuple(args),
        dict(kwargs),
        queue if isinstance(queue, str) else None,
        missed,
        since,
        flow,
    )


def _flow(spec: TaskSpec, options: Mapping[str, Any], name: str) -> tuple[str | None, str | None]:
    """An entry's own flow control (``options["limit"]``, ``options["concurrency_key"]``),
    checked now, so ``manage.py check`` names it (relier.E010), not each tick's push.

    Raises:
        ValueError, TypeError: a limit the settings lack, a key that is not one or that
            keys nothing.
    """
    limit, key = call_flow(options, f"periodic entry {name!r}")
    named = current().named_limits()
    if limit is not None and limit not in named:
        known = ", ".join(sorted(named)) or "none defined"
        raise ValueError(f"its 'limit' {limit!r} is not in RELIER['LIMITS'] ({known})")
    if key is not None and limit is None and not spec.limits:
        raise ValueError(
            f"its 'concurrency_key' {key!r} keys nothing: the task has no concurrency=, "
            "limit= or rate=, and the entry gives no 'limit'"
        )
    return limit, key


def tick_id(
    entry: str, tick_ms: int, keys: KeySpace | None = None, claim: str | None = None
) -> str:
    """The task id of ``entry``'s tick at ``tick_ms``: the same for every scanner. On a
    partitioned store, an idempotent task's tick id is the first of a fixed sequence
    that falls in its idempotency ``claim``'s partition (one script stores both)."""
    base = f"relier.periodic\0{entry}\0{tick_ms}"
    found = hashlib.sha256(base.encode()).hexdigest()[:32]
    if keys is None or claim is None or keys.partitions == 1:
        return found
    want, n = keys.partition_of_key(claim), 0
    while keys.partition_of(found) != want:
        n += 1
        found = hashlib.sha256(f"{base}\0{n}".encode()).hexdigest()[:32]
    return found


def tick_key(entry: str, tick_ms: int) -> str:
    """The idempotency key an idempotent task's tick is pushed under: the tick's own,
    which no other push shares (see the module's decision)."""
    return f"periodic:{entry}@{tick_ms}"


def entry_tick_id(app: Any, entry: Entry, tick_ms: int, keys: KeySpace) -> str:
    """:func:`tick_id` of one of the app's entries (in the partition of its tick's
    idempotency claim, :func:`tick_key`, if its task is idempotent)."""
    spec: TaskSpec = app.tasks[entry.task].relier_spec
    claim = None
    if spec.idempotent:
        claim = keys.idempotency(spec.name, tick_key(entry.name, tick_ms))
    return tick_id(entry.name, tick_ms, keys, claim)


@dataclass(frozen=True, slots=True)
class Claim:
    """tick.lua's reply: code 1 claimed ``tick`` (push it), 0 nothing to do (``tick``
    is the last recorded), 2 another caller holds ``tick``."""

    code: int
    tick: int


def claim(
    keys: KeySpace, entry: str, tick_ms: int, token: str, lease_ms: int, seed: bool = False
) -> scripts.ScriptCall[Claim]:
    """tick.lua: claim ``entry``'s tick at ``tick_ms`` for ``lease_ms``; with ``seed``,
    record ``tick_ms`` (the caller's now) as handled if the entry has no state yet."""
    return scripts.ScriptCall(
        scripts.TICK,
        keys.for_tick(),
        [entry, tick_ms, token, lease_ms, "1" if seed else "0"],
        lambda r: Claim(int(r[0]), int(r[1])),
    )


def done(keys: KeySpace, entry: str, tick_ms: int, token: str) -> scripts.ScriptCall[int]:
    """tick_done.lua: record ``entry``'s tick at ``tick_ms`` as handled and drop the
    claim ``token`` holds; returns the entry's last recorded tick."""
    return scripts.ScriptCall(scripts.TICK_DONE, keys.for_tick_done(), [entry, tick_ms, token], int)


def fire_due(app: Any, config: Config, now_ms: int) -> int:
    """Fire every due tick of the app's periodic entries that name an ``@rl_task``.

    Safe to call from any number of scanners at once: each tick is pushed once.

    Args:
        app: the Celery app whose ``beat_schedule`` is read (its tasks imported).
        config: relier's config (key prefix, ``RESURRECT_LEASE_S`` for the claims).
        now_ms: the Redis clock, epoch ms.

    Returns:
        When to call again, epoch ms: the earliest next tick (sooner when a tick is
        left for a later call: claimed by another scanner, refused, failed).
    """
    return _Firing(app, config, now_ms).run()


_warned: set[tuple[str, str]] = set()  # (entry, problem) logged by this process
# entry -> the failure last logged for it by this process, until the entry settles:
# a failure that repeats at every pass is logged once, with its traceback, not every
# pass; a different one, or the same after a success, is logged again.
_failing: dict[str, str] = {}


class _Firing:
    """One ``fire_due`` call."""

    def __init__(self, app: Any, config: Config, now_ms: int) -> None:
        self.app, self.config, self.now_ms = app, config, now_ms
        self.keys = KeySpace.of(config)
        self.client = sync_client(config)
        self.lease_ms = int(config.resurrect_lease_s * 1000)
        self.on_time_ms = int((config.leader_lease_ttl_s + config.scan_interval_s) * 1000)

    def run(self) -> int:
        entries, rejected = read_entries(self.app)
        for bad in rejected:
            if bad.problem is Problem.SOURCE_FAILED:
                # Said by the source itself, which knows whether it kept its last read.
                logger.error("periodic source=%s failed: %s", bad.where, bad.detail)
            elif bad.problem is not Problem.NOT_RELIER and (bad.entry, bad.problem) not in _warned:
                _warned.add((bad.entry, bad.problem))
                # A name taken is a duplicate, not a loss: the first entry fires.
                level = logging.WARNING if bad.problem is Problem.NAME_TAKEN else logging.ERROR
                logger.log(
                    level,
                    "periodic entry=%s (%s) is not fired: %s",
                    bad.entry,
                    bad.where,
                    bad.detail,
                )
        if not entries:
            return self.now_ms + _IDLE_MS
        lasts = self.client.hmget(self.keys.periodic, [e.name for e in entries])
        retry_at = self.now_ms + int(self.config.scan_interval_s * 1000)
        next_due = self.now_ms + _IDLE_MS
        for entry, last in zip(entries, lasts, strict=True):
            # Everything about one entry, its next tick included, inside its own try:
            # one entry's failure never stops the others' ticks (issue #35).
            try:
                settled = self._entry(entry, None if last is None else int(last))
                nxt = entry.schedule.next_after(self.now_ms)
            except Exception as exc:
                _failed(entry.name, exc)
                next_due = min(next_due, retry_at)
                continue
            _failing.pop(entry.name, None)
            next_due = min(next_due, nxt if settled else min(nxt, retry_at))
        return next_due

    def _entry(self, entry: Entry, last: int | None) -> bool:
        """Fire ``entry``'s due ticks; False when some are left for a later call."""
        if last is None:  # first seen: its first tick is the next one
            return self._settle(entry, self.now_ms, seed=True)
        if entry.since_ms is not None and entry.since_ms > last:
            # Changed since its last tick: the ticks before the change are not its
            # (a row re-enabled after a month fires none of the month's), and like any
            # skipped tick they are recorded, and logged with their count.
            before = entry.schedule.due(last, min(entry.since_ms, self.now_ms), CATCH_UP_LIMIT)
            if before.ticks:
                logger.warning(
                    "periodic entry=%s skipped %s%s tick(s) due since %s, before its last "
                    "change at %s",
                    entry.name,
                    "" if before.exact else "about ",
                    before.total,
                    _iso(last),
                    _iso(entry.since_ms),
                )
                done(self.keys, entry.name, before.ticks[-1], "").run(self.client)
            last = entry.since_ms
        due = entry.schedule.due(last, self.now_ms, CATCH_UP_LIMIT)
        if not due.ticks:
            return True
        chosen = plan(entry.missed, due, self.now_ms, self.on_time_ms)
        if chosen.skipped:
            logger.warning(
                "periodic entry=%s missed=%s skipped %s%s tick(s) due since %s; firing %s",
                entry.name,
                entry.missed.value,
                "" if due.exact else "about ",
                chosen.skipped,
                _iso(last),
                ", ".join(_iso(t) for t in chosen.fire) or "none",
            )
        for tick in chosen.fire:
            if not self._settle(entry, tick):
                return False
        if chosen.skip_to is not None:
            done(self.keys, entry.name, chosen.skip_to, "").run(self.client)
        return True

    def _settle(self, entry: Entry, tick: int, seed: bool = False) -> bool:
        """Claim ``tick``, push and record it (first any older tick whose claimer died);
        True once it is handled, by this call or another."""
        for _ in range(3):  # at most one older claim to take over, then ours
            token, started = uuid.uuid4().hex, time.monotonic()
            got = claim(self.keys, entry.name, tick, token, self.lease_ms, seed).run(self.client)
            if got.code == 0:
                return True
            if got.code == 2:
                logger.debug("periodic entry=%s tick=%s claimed by another", entry.name, got.tick)
                return False
            if not self._push(entry, got.tick, started):
                return False  # the claim runs out; a later call pushes the same tick
            done(self.keys, entry.name, got.tick, token).run(self.client)
            if got.tick == tick:
                return True
        return False

    def _resend_if_unstarted(self, task_id: str) -> None:
        """A tick's task whose claimer died may be stored and never sent (a tick's push
        stores, then publishes: its due time is given, so the store cannot queue it in
        the same step). While it has not started, send it again: a second message of
        fence 1 is refused by ``start.lua`` if the first one was in the queue after
        all, and this one saves it waiting out ``QUEUED_GRACE_S``."""
        state, fence, stored = self.client.hmget(self.keys.task(task_id), "state", "fence", "env")
        if _text(state) != "queued" or _text(fence) != "1" or not stored:
            return
        try:
            env = decode(_text(stored), self.config.signer)
            publish.send(self.app, env, _text(stored))
        except Exception:  # the queued grace still brings it back
            logger.warning("periodic tick task_id=%s: could not send it again", task_id,
                           exc_info=True)  # fmt: skip
            return
        logger.info("periodic tick task_id=%s: stored, not started; sent again", task_id)

    def _push(self, entry: Entry, tick: int, claimed_at: float) -> bool:
        if time.monotonic() - claimed_at > self.lease_ms / 1000:
            # Another scanner may have taken the claim over: it pushes this tick.
            logger.warning(
                "periodic entry=%s tick=%s: claim outlived, not pushed", entry.name, _iso(tick)
            )
            return False
        spec = self.app.tasks[entry.task].relier_spec
        task_id = entry_tick_id(self.app, entry, tick, KeySpace.of(self.config))
        try:
            receipt = producer.push(
                spec,
                self.app,
                entry.args,
                dict(entry.kwargs or {}),
                task_id=task_id,
                queue=entry.queue,
                when=Timing(eta_ms=tick),
                idempotency_key=tick_key(entry.name, tick) if spec.idempotent else None,
                on_commit=False,
                flow=entry.flow,
            )
        except DuplicateTaskId:
            # The tick's task exists (its claimer died after pushing it): fired once.
            logger.info(
                "periodic entry=%s tick=%s already pushed task_id=%s",
                entry.name,
                _iso(tick),
                task_id,
            )
            self._resend_if_unstarted(task_id)
            return True
        except AdmissionRejected as exc:
            logger.warning(
                "periodic entry=%s tick=%s refused by admission control; retried "
                "after %.3f s or later",
                entry.name,
                _iso(tick),
                exc.retry_after_s,
            )
            return False
        if receipt.deduplicated:
            # Only this tick's own push holds its key: it was pushed already. Said as
            # such, never as "fired": nothing new will run.
            logger.info(
                "periodic entry=%s tick=%s already pushed task_id=%s (deduplicated)",
                entry.name,
                _iso(tick),
                receipt.duplicate_of or receipt.task_id,
            )
            return True
        logger.info(
            "periodic entry=%s tick=%s fired task=%s task_id=%s",
            entry.name,
            _iso(tick),
            entry.task,
            task_id,
        )
        return True


def _failed(entry: str, exc: Exception) -> None:
    """Log an entry's failed pass: at ERROR with its traceback the first time, at DEBUG
    while the same failure repeats (see ``_failing``)."""
    seen = f"{type(exc).__name__}: {exc}"
    if _failing.get(entry) == seen:
        logger.debug("periodic entry=%s: firing failed again: %s", entry, seen)
        return
    _failing[entry] = seen
    logger.error(
        "periodic entry=%s: firing failed; a later pass retries (logged once while it "
        "repeats)", entry, exc_info=exc,
    )  # fmt: skip


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")
