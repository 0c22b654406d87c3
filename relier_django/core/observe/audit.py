"""The delivery audit (``manage.py relier_audit``): every task the ledger noted in a
time range, each explained by what the store holds for it now.

``push.lua`` (every push: ``push()``, the outbox relay, periodic ticks, DLQ-free
re-pushes), ``commit.lua`` (a workflow's next step) and ``handover_store.lua`` (a task a
partitioned store's hand-over brings about) note each task they store in its
partition's ledger (``<p>:ledger``, a stream trimmed to ``AUDIT_HORIZON_S``); ``abort.lua``
takes the note back when it undoes a store because the push raised. The audit reads
the notes and puts each id in one class, from one consistent reading (``MULTI``) of
its keys:

- ``committed``: its outcome record says so (``<p>:r:{id}``, kept ``RESULT_TTL_S``);
- ``dead_lettered``: its outcome record says failed, or its DLQ entry exists (the reason
  is counted);
- ``cancelled``: its outcome record says cancelled;
- ``in_flight``: its task hash exists and it is within its bound: an index (expiry or
  schedule) holds it with a deadline or due time that has not passed by more than
  ``slack_ms``, or it waits for a flow-control slot (``parked``);
- otherwise **unexplained**: ``gone`` (no key of it is left), ``overdue`` (in flight
  past its bound), or ``unindexed`` (a task hash that no index holds).

Because the horizon is at most ``RESULT_TTL_S`` (``Config.problems``), a task noted
inside it that finished still has its outcome record: a finished task is never
reported as gone for its record's expiry.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.cluster import RedisCluster

from ..store.keys import KeySpace

CLASSES: tuple[str, ...] = ("committed", "dead_lettered", "cancelled", "in_flight")
_PAGE = 1000  # ledger entries per XRANGE; ids classified per MULTI


@dataclass(frozen=True, slots=True)
class Unexplained:
    """A noted task the store cannot account for."""

    task_id: str
    noted_ms: int  # when the ledger noted it (Redis clock)
    why: str  # 'gone', 'overdue' or 'unindexed'

    def to_json(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "noted_ms": self.noted_ms, "why": self.why}


@dataclass(frozen=True, slots=True)
class Audit:
    """One audit: how many noted tasks fell in each class, and which were unexplained
    (the first ``limit`` of them; ``unexplained`` counts them all)."""

    at_ms: int
    since_ms: int
    horizon_ms: int  # 0: the ledger is off, so nothing was noted
    noted: int
    classes: dict[str, int]
    dead_lettered_by_reason: dict[str, int]
    in_flight_by_state: dict[str, int]
    unexplained: int
    unexplained_ids: list[Unexplained] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` form; its keys are documented in docs/commands.md."""
        return {
            "at_ms": self.at_ms,
            "since_ms": self.since_ms,
            "horizon_s": self.horizon_ms / 1000,
            "ledger": self.horizon_ms > 0,
            "noted": self.noted,
            **{name: self.classes.get(name, 0) for name in CLASSES},
            "dead_lettered_by_reason": dict(sorted(self.dead_lettered_by_reason.items())),
            "in_flight_by_state": dict(sorted(self.in_flight_by_state.items())),
            "unexplained": self.unexplained,
            "unexplained_ids": [u.to_json() for u in self.unexplained_ids],
        }


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _noted(client: redis.Redis, ledger: str, since_ms: int) -> dict[str, int]:
    """id -> when it was first noted, from one partition's ledger."""
    found: dict[str, int] = {}
    start = f"{since_ms}-0"
    while True:
        page: list[Any] = client.xrange(ledger, min=start, max="+", count=_PAGE) or []
        for raw_id, fields in page:
            at = int(str(_text(raw_id)).partition("-")[0])
            for raw_task in (fields or {}).values():
                found.setdefault(_text(raw_task) or "", at)
        if len(page) < _PAGE:
            return found
        start = f"({_text(page[-1][0])}"


def _classify(
    client: redis.Redis, keys: KeySpace, ids: list[str], slack_ms: int
) -> tuple[int, list[tuple[str, str, str]]]:
    """The Redis clock and ``(id, class, detail)`` for each id, from one MULTI: the
    keys are read as they stood together, so a task moving on meanwhile is seen once."""
    # A cluster's pipeline reads each key where it lives and takes no TIME (it has no
    # slot): there the clock is read first, and the reading is consistent per key only.
    cluster = isinstance(client, RedisCluster)
    pipe = client.pipeline(transaction=not cluster)
    if not cluster:
        pipe.time()
    for task_id in ids:
        pipe.get(keys.result(task_id))
        pipe.hget(keys.dlq_entry(task_id), "reason")
        pipe.hget(keys.task(task_id), "state")
        pipe.zscore(keys.expiry, task_id)
        pipe.zscore(keys.schedule, task_id)
    replies = [now(client)] if cluster else []
    replies += pipe.execute()
    now_ms = replies[0] if cluster else _ms(replies[0])
    out: list[tuple[str, str, str]] = []
    for i, task_id in enumerate(ids):
        record, reason, state, deadline, due = replies[1 + 5 * i : 6 + 5 * i]
        out.append((task_id, *_class_of(record, reason, state, deadline, due, now_ms, slack_ms)))
    return now_ms, out


def _class_of(
    record: Any, reason: Any, state: Any, deadline: Any, due: Any, now_ms: int, slack_ms: int
) -> tuple[str, str]:
    if record is not None:
        data = json.loads(_text(record) or "{}")
        status = data.get("status")
        if status == "ok":
            return "committed", ""
        if status == "cancelled":
            return "cancelled", ""
        return "dead_lettered", _text(reason) or str(data.get("reason") or "")
    if reason is not None:
        return "dead_lettered", _text(reason) or ""
    state_text = _text(state)
    if state_text is None:
        return "", "gone"
    if state_text == "parked":  # waits for a slot of its limit, in turn (G14)
        return "in_flight", state_text
    bound = max((float(x) for x in (deadline, due) if x is not None), default=None)
    if bound is None:
        return "", "unindexed"
    if bound + slack_ms < now_ms:
        return "", "overdue"
    return "in_flight", state_text


def audit(
    client: redis.Redis, keys: KeySpace, since_ms: int, slack_ms: int, limit: int = 1000
) -> Audit:
    """Every task noted since ``since_ms`` (Redis clock), classified. ``slack_ms``: how
    far past its deadline or due time an in-flight task still counts as within its
    bound (the scanner's detection: a scan interval and a second, say). ``limit``: at
    most this many unexplained ids are listed."""
    classes: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    states: Counter[str] = Counter()
    unexplained: list[Unexplained] = []
    missing = noted = 0
    now_ms = since_ms
    for part in keys.parts():
        found = _noted(client, part.ledger, since_ms)
        noted += len(found)
        ids = list(found)
        for start in range(0, len(ids), _PAGE):
            chunk = ids[start : start + _PAGE]
            now_ms, rows = _classify(client, part, chunk, slack_ms)
            for task_id, kind, detail in rows:
                if not kind:
                    missing += 1
                    if len(unexplained) < limit:
                        unexplained.append(Unexplained(task_id, found[task_id], detail))
                    continue
                classes[kind] += 1
                if kind == "dead_lettered":
                    reasons[detail or "unknown"] += 1
                elif kind == "in_flight":
                    states[detail] += 1
    if not noted:
        now_ms = now(client)
    return Audit(
        now_ms, since_ms, keys.ledger_ms, noted, dict(classes), dict(reasons), dict(states),
        missing, sorted(unexplained, key=lambda u: (u.noted_ms, u.task_id)),
    )  # fmt: skip


def now(client: redis.Redis) -> int:
    """The Redis clock, ms: the audit's ranges are on it, as the ledger's ids are."""
    return _ms(client.time())


def _ms(reply: Any) -> int:
    if isinstance(reply, dict):  # a cluster's TIME: one reply per node asked
        reply = next(iter(reply.values()))
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000
