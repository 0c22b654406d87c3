"""What is in flight right now, read from the store's own indexes.

Every unfinished task that is not scheduled is in the expiry index (``<p>:expiry``),
and its hash says its state: ``queued`` (no worker holds it), ``reserved`` (a worker
prefetched it: heartbeat.lua marked it with that worker), ``running``, or
``recovering`` (handed off, or leased to the DLQ, for the scanner to finish). Scheduled
tasks are the schedule index's. These are counted from the store when asked, not kept
as counters, so they cannot drift from what it holds. A partitioned store has these
indexes in each partition (``KeySpace.parts``): the counts are their sums, the oldest
queued task the oldest of all, the scan the first ``SCAN_LIMIT`` by deadline of all.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections import Counter
from dataclasses import dataclass
from typing import Any

import redis

from ..store import progress
from ..store.keys import KeySpace
from ..store.progress import Progress

STATES: tuple[str, ...] = ("queued", "reserved", "running", "scheduled", "recovering")
# The scan reads at most this many in-flight tasks (pipelined, 1,000 per round trip);
# past it the counts cover the first SCAN_LIMIT by deadline and say so (truncated).
SCAN_LIMIT = 100_000
TASK_LIST_LIMIT = 50  # tasks listed (oldest first) in the live view
_CHUNK = 1000
_FIELDS = ("state", "worker", "fence", "name", "queue", "created_ms", "q_ms", "started_ms",
           "due_ms", "attempt", "res")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Task:
    """One in-flight task as the live view lists it."""

    task_id: str
    name: str
    queue: str
    state: str
    fence: int
    worker: str
    age_s: float  # since it could start (queued, reserved) or since it started (running)
    attempt: int
    resurrections: int
    progress: Progress | None = None  # what it last reported (ctx.set_progress)

    def to_json(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id, "name": self.name, "queue": self.queue,
            "state": self.state, "fence": self.fence, "worker": self.worker,
            "age_s": round(self.age_s, 3), "attempt": self.attempt,
            "resurrections": self.resurrections,
            "progress": None if self.progress is None else self.progress.to_json(),
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class Worker:
    """A worker main process that announced itself (presence.lua), with the number of
    tasks its pool processes and itself hold (matched by host and main pid, or host
    alone for pool processes, whose pids differ)."""

    id: str
    tasks: int


@dataclass(frozen=True, slots=True)
class Live:
    by_state: dict[str, int]
    oldest_queued_s: float | None  # the longest any queued or reserved task has waited
    overdue: int  # in the expiry index past their deadline: the scanner's next work
    workers: tuple[Worker, ...]
    tasks: tuple[Task, ...]  # running first, then the rest; oldest first within each
    truncated: bool  # more than SCAN_LIMIT in flight: the counts cover SCAN_LIMIT


def as_text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else ("" if raw is None else str(raw))


def as_int(raw: Any, default: int = 0) -> int:
    try:
        return int(as_text(raw))
    except ValueError:
        return default


def state_name(stored: str, worker: str) -> str:
    """The live view's name for a stored state (a queued task a worker marked is
    reserved)."""
    if stored == "queued":
        return "reserved" if worker else "queued"
    if stored == "running":
        return "running"
    return "recovering"  # handoff, dying: the scanner finishes them


def scan(
    client: redis.Redis, keys: KeySpace, now_ms: int, *, task_limit: int = TASK_LIST_LIMIT
) -> Live:
    """Count in-flight tasks by state and list the oldest ``task_limit`` of them: every
    partition's, read in one round trip, then their task hashes 1,000 per round trip."""
    pipe = client.pipeline(transaction=False)
    pipe.zrange(keys.workers, 0, -1, withscores=True)
    for p in keys.parts():
        pipe.zcard(p.schedule)
        pipe.zcount(p.expiry, "-inf", now_ms)
        pipe.zrange(p.expiry, 0, SCAN_LIMIT - 1, withscores=True)
        pipe.zcard(p.expiry)
    workers_raw, *each = pipe.execute()
    scheduled = sum(int(n) for n in each[0::4])
    overdue = sum(int(n) for n in each[1::4])
    total = sum(int(n) for n in each[3::4])
    # The first SCAN_LIMIT by deadline of all are among the first SCAN_LIMIT of each
    # partition: merged by deadline, as one index would list them.
    by_deadline = heapq.merge(*each[2::4], key=lambda row: float(row[1]))
    ids = [as_text(i) for i, _ in itertools.islice(by_deadline, SCAN_LIMIT)]
    counts: Counter[str] = Counter()
    oldest: float | None = None
    tasks: list[Task] = []
    held: Counter[str] = Counter()
    for at in range(0, len(ids), _CHUNK):
        chunk = ids[at : at + _CHUNK]
        pipe = client.pipeline(transaction=False)
        for task_id in chunk:
            pipe.hmget(keys.task(task_id), *_FIELDS)
        for task_id, row in zip(chunk, pipe.execute(), strict=True):
            f = dict(zip(_FIELDS, (as_text(v) for v in row), strict=True))
            if not f["state"]:
                continue  # finished between the two reads
            state = state_name(f["state"], f["worker"])
            counts[state] += 1
            if f["worker"]:
                held[f["worker"]] += 1
            if state == "running":
                since = as_int(f["started_ms"], now_ms)
            else:
                since = max(
                    as_int(f["q_ms"]) or as_int(f["created_ms"], now_ms), as_int(f["due_ms"])
                )
            age_s = max(0.0, (now_ms - since) / 1000)
            if state in ("queued", "reserved") and (oldest is None or age_s > oldest):
                oldest = age_s
            tasks.append(
                Task(
                    task_id,
                    f["name"],
                    f["queue"],
                    state,
                    as_int(f["fence"]),
                    f["worker"],
                    age_s,
                    as_int(f["attempt"], 1),
                    as_int(f["res"]),
                )
            )
    tasks.sort(key=lambda t: (t.state != "running", -t.age_s))
    listed = _with_progress(client, keys, tasks[:task_limit])
    counts["scheduled"] = scheduled
    alive = [
        (as_text(w), float(deadline)) for w, deadline in workers_raw if float(deadline) >= now_ms
    ]
    return Live(
        by_state={state: counts.get(state, 0) for state in STATES},
        oldest_queued_s=oldest,
        overdue=overdue,
        workers=tuple(Worker(w, _held_by(w, held)) for w, _ in alive),
        tasks=listed,
        truncated=total > len(ids),
    )


def _held_by(worker: str, held: Counter[str]) -> int:
    # A pool process's id is the same host with its own pid: one worker per host is
    # the common case; with several on one host each shows the host's total.
    host = worker.rpartition(":")[0]
    return sum(n for holder, n in held.items() if holder.rpartition(":")[0] == host)


def _with_progress(client: redis.Redis, keys: KeySpace, listed: list[Task]) -> tuple[Task, ...]:
    # Read for the listed tasks only, in one more round trip: a progress may be up to
    # CHECKPOINT_MAX_BYTES, too much to fetch for every task the scan counts.
    if not listed:
        return ()
    pipe = client.pipeline(transaction=False)
    for t in listed:
        pipe.hget(keys.task(t.task_id), "progress")
    return tuple(
        dataclasses.replace(t, progress=progress.load(as_text(raw) or None))
        for t, raw in zip(listed, pipe.execute(), strict=True)
    )
