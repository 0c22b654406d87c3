"""Tampering with messages while they wait in the broker's Redis list.

A kombu message in the Redis transport is a JSON document whose ``body`` is base64 of
``[args, kwargs, embed]``; relier's envelope is ``args[0]``, and the Celery task name
is ``headers.task``. Three kinds of tampering, each with the DLQ reason it must get:

- ``checksum``: change a field of the envelope, keep its sha256 → ``payload_integrity``
- ``json``: cut the envelope's closing brace → ``malformed_message``
- ``unknown``: rename ``headers.task`` to a task no worker has → ``unknown_task``

A broken envelope cannot be trusted to say which task it is, so its DLQ entry keeps
the raw body untied to any task; the task itself still has its intact stored copy,
which the resurrector re-dispatches once its queued grace runs out: it commits once.
A message addressed to an unknown task is a valid envelope, so that task moves to the
DLQ itself.
"""

from __future__ import annotations

import base64
import dataclasses
import json

from ..evidence import Evidence
from ..invariants import Check
from ..runner import Options, Run
from . import Scenario

KINDS = ("checksum", "json", "unknown")
REASON = {"checksum": "payload_integrity", "json": "malformed_message", "unknown": "unknown_task"}
UNKNOWN_NAME = "demo.no_such_task"

# Compare-and-set of one list element by value, atomic against a consumer's BRPOP.
_REPLACE = """
local pos = redis.call('LPOS', KEYS[1], ARGV[1])
if not pos then return 0 end
redis.call('LSET', KEYS[1], pos, ARGV[2])
return 1
"""


def find_message(client, queue: str, task_id: str) -> str | None:
    for raw in client.lrange(queue, 0, -1):
        if json.loads(raw).get("headers", {}).get("id") == task_id:
            return raw
    return None


def tampered(raw: str, kind: str) -> str:
    """``raw`` (a kombu message) with its envelope or task name broken as ``kind`` says."""
    message = json.loads(raw)
    args, kwargs, embed = json.loads(base64.b64decode(message["body"]))
    envelope = args[0]
    if kind == "checksum":
        body = json.loads(envelope)
        body["kwargs"]["work_s"] = body["kwargs"].get("work_s", 0) + 1  # sha256 left as it was
        envelope = json.dumps(body, sort_keys=True, separators=(",", ":"))
    elif kind == "json":
        envelope = envelope[:-1]
    elif kind == "unknown":
        message["headers"]["task"] = UNKNOWN_NAME
    else:
        raise ValueError(kind)
    message["body"] = base64.b64encode(json.dumps([[envelope], kwargs, embed]).encode()).decode()
    return json.dumps(message)


def tamper(client, queue: str, task_id: str, kind: str) -> bool:
    raw = find_message(client, queue, task_id)
    if raw is None:
        return False
    return bool(client.eval(_REPLACE, 1, queue, raw, tampered(raw, kind)))


def _grace_s(opts: Options) -> float:
    # Above the whole backlog's wait (every task is queued before the workers start,
    # and starting them can take seconds on a busy machine), so untouched tasks are
    # never re-dispatched; a broken message's task comes back once it runs out.
    return round(10 + opts.tasks * 0.05, 1)


def task_corrupt(run: Run) -> None:
    items = run.items(run.n, (0.02, 0.08))
    count = max(3, run.n // 10)
    chosen = dict(zip(run.rng.sample(range(run.n), count), KINDS * count, strict=False))
    for index, kind in chosen.items():
        if kind == "unknown":
            items[index] = dataclasses.replace(items[index], expect=REASON[kind])
    pushed = run.push_all(items)  # no worker yet: every message waits in the list
    kinds: dict[str, str] = {}
    client = run.client
    for index, kind in chosen.items():
        task_id = pushed[index].task_id
        if not tamper(client, "celery", task_id, kind):
            raise RuntimeError(f"message of {task_id} not found in the queue")
        kinds[task_id] = kind
    counts = {k: sum(1 for v in kinds.values() if v == k) for k in KINDS}
    run.fault(
        f"tampered with {len(kinds)} queued messages in place: broken checksum x"
        f"{counts['checksum']}, broken JSON x{counts['json']}, unknown task name x"
        f"{counts['unknown']}",
        interrupts=False,
    )
    run.start()
    run.verify(_checks(kinds))


def _checks(kinds: dict[str, str]):  # type: ignore[no-untyped-def]
    def verify(ev: Evidence) -> list[Check]:
        quarantined = []
        for task_id, kind in kinds.items():
            if kind == "unknown":
                entry = ev.dlq.get(task_id)
                ok = entry is not None and entry.reason == REASON[kind]
            else:
                ok = any(u.reason == REASON[kind] and task_id in (u.raw or "") for u in ev.untied)
            quarantined.append(ok)
        broken = [t for t, k in kinds.items() if k != "unknown"]
        never_ran = [
            t
            for t, k in kinds.items()
            if (k == "unknown" and ev.executions_of(t))
            or any(e.fence == 1 for e in ev.executions_of(t))
        ]
        recovered = [
            t
            for t in broken
            if (ev.outcomes.get(t) or {}).get("status") == "ok"
            and ev.outcomes[t]["result"]["fence"] > 1
        ]
        untouched = [t for t in ev.pushed if t not in kinds]
        clean = [
            t
            for t in untouched
            if (ev.outcomes.get(t) or {}).get("status") == "ok"
            and ev.outcomes[t]["result"]["fence"] == 1
            and len(ev.executions_of(t, "start")) == 1
        ]
        expected_entries = len(kinds)
        entries = len(ev.dlq) + len(ev.untied)
        return [
            Check(
                "each tampered message is in the DLQ with the right reason",
                all(quarantined),
                f"{sum(quarantined)}/{len(kinds)} ("
                + ", ".join(f"{k}: {REASON[k]}" for k in KINDS)
                + ")",
            ),
            Check(
                "no tampered message ran",
                not never_ran,
                f"{len(never_ran)} ran" + (f": {', '.join(never_ran[:3])}" if never_ran else ""),
            ),
            Check(
                "broken messages' tasks ran from their stored copy (fence > 1), once",
                len(recovered) == len(broken),
                f"{len(recovered)}/{len(broken)}",
            ),
            Check(
                "nothing else affected: untouched tasks ran once, at fence 1; no other entry",
                len(clean) == len(untouched) and entries == expected_entries,
                f"{len(clean)}/{len(untouched)} untouched; DLQ entries {entries} "
                f"(expected {expected_entries})",
            ),
        ]

    return verify


TASK_CORRUPT = Scenario(
    "task-corrupt",
    "tamper with queued messages (checksum, JSON, task name): each lands in the DLQ",
    task_corrupt,
    env=lambda opts: {"RELIER_QUEUED_GRACE_S": str(_grace_s(opts))},
)
