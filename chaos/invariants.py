"""The invariants every scenario must hold, checked against :class:`Evidence`.

Pure functions of the evidence (no I/O), so a fabricated record with a double commit
or a lost task can prove the checker is not vacuous (tests/chaos/test_chaos_runner.py).

Per pushed task, exactly one of:

- **committed once**: one accepted commit (log lines, and the result key's fence when
  its line was lost), an ``ok`` outcome, no DLQ entry;
- **in the DLQ with a reason**: a DLQ entry with a reason, a ``failed`` outcome, no
  commit;
- **committed twice**: more than one accepted commit, or a commit and a DLQ entry;
- **lost**: neither a commit nor a DLQ entry once the run drained.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .evidence import Evidence

COMMITTED_ONCE = "committed once"
IN_DLQ = "in DLQ"
COMMITTED_TWICE = "committed twice"
LOST = "lost"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str = ""


@dataclass
class Verdict:
    task_id: str
    status: str
    commits: list[int] = field(default_factory=list)  # fences of accepted commits
    from_result_only: bool = False  # the commit is known from the result key alone
    reason: str | None = None  # DLQ reason

    def outcome(self) -> str:
        """What happened, in the vocabulary of ``Pushed.expect``."""
        if self.status == COMMITTED_ONCE:
            return "commit"
        return self.reason or self.status


def _result_fence(outcome: dict | None) -> int | None:
    if not outcome or outcome.get("status") != "ok":
        return None
    result = outcome.get("result")
    fence = result.get("fence") if isinstance(result, dict) else None
    return fence if isinstance(fence, int) else None


def verdicts(ev: Evidence) -> dict[str, Verdict]:
    commits: dict[str, list[int]] = {}
    for event in ev.log_events:
        if event.kind == "committed" and event.fence is not None:
            commits.setdefault(event.task_id, []).append(event.fence)
    out: dict[str, Verdict] = {}
    for task_id in ev.pushed:
        outcome = ev.outcomes.get(task_id)
        fences = list(commits.get(task_id, []))
        only_result = False
        if outcome and outcome.get("status") == "ok" and not fences:
            fences = [_result_fence(outcome) or 0]  # committed; its log line was lost
            only_result = True
        entry = ev.dlq.get(task_id)
        reason = entry.reason if entry is not None and entry.reason else None
        if len(fences) > 1 or (fences and entry is not None):
            status = COMMITTED_TWICE
        elif fences and outcome and outcome.get("status") == "ok":
            status = COMMITTED_ONCE
        elif reason and outcome and outcome.get("status") == "failed":
            status = IN_DLQ
        else:
            status = LOST
        out[task_id] = Verdict(task_id, status, fences, only_result, reason)
    return out


def _ids(ids: list[str], limit: int = 5) -> str:
    more = f" (+{len(ids) - limit} more)" if len(ids) > limit else ""
    return ", ".join(ids[:limit]) + more


def _no_false_deaths(ev: Evidence) -> Check:
    """A holder declared dead by its connection (recovery/deaths.py) whose process still
    lived after the drain was declared dead falsely: a Redis restart, a failover or a
    network cut must never do that. (Fencing keeps it safe; it costs a second run.)"""
    found = {e.task_id for e in ev.log_events if e.kind == "found_dead"}
    alive = sorted(ev.found_dead_alive)
    return Check(
        "false deaths = 0 (a live process declared dead)",
        not alive,
        f"{len(alive)} of {len(found)} found dead" + (f": {_ids(alive)}" if alive else ""),
    )


def check(ev: Evidence) -> list[Check]:
    """The invariants every scenario shares, in the order the report prints them."""
    v = verdicts(ev)
    by_status = Counter(x.status for x in v.values())
    once, dlq = by_status[COMMITTED_ONCE], by_status[IN_DLQ]
    lost = sorted(t for t, x in v.items() if x.status == LOST)
    twice = sorted(t for t, x in v.items() if x.status == COMMITTED_TWICE)
    pushed = len(ev.pushed)
    checks = [
        Check(
            "pushed = committed once + in DLQ with a reason",
            pushed == once + dlq,
            f"{pushed} = {once} + {dlq}",
        ),
        Check("lost = 0", not lost, f"{len(lost)}" + (f": {_ids(lost)}" if lost else "")),
        Check(
            "committed twice = 0",
            not twice,
            f"{len(twice)}"
            + (f": {', '.join(f'{t} fences {v[t].commits}' for t in twice[:5])}" if twice else ""),
        ),
    ]
    unexpected = sorted(
        t for t, x in v.items() if x.status in (COMMITTED_ONCE, IN_DLQ)
        and x.outcome() != ev.pushed[t].expect
    )  # fmt: skip
    expected = Counter(p.expect for p in ev.pushed.values())
    checks.append(
        Check(
            "every outcome is the expected one",
            not unexpected,
            ", ".join(f"{n} {k}" for k, n in sorted(expected.items()))
            + "".join(
                f"; {t}: expected {ev.pushed[t].expect}, got {v[t].outcome()}"
                for t in unexpected[:5]
            ),
        )
    )
    checks.append(_commits_match_executions(ev, v))
    checks.append(_no_false_deaths(ev))
    leaked = ev.leaked_keys + [f"{k} (no TTL)" for k in ev.keys_without_ttl]
    kept = ", ".join(f"{n} {pattern}" for pattern, n in sorted(ev.kept_keys.items()))
    checks.append(
        Check(
            "leaked keys = 0 after the drain",
            not leaked,
            f"{len(leaked)}" + (f": {_ids(leaked)}" if leaked else "") + f" (kept: {kept or '-'})",
        )
    )
    if ev.audit is not None:
        gone = [f"{u.task_id} ({u.why})" for u in ev.audit.unexplained_ids]
        checks.append(
            Check(
                "relier_audit: unexplained = 0",
                not ev.audit.unexplained,
                f"{ev.audit.unexplained} of {ev.audit.noted} noted"
                + (f": {_ids(gone)}" if gone else ""),
            )
        )
    busy = {k: n for k, n in {**ev.in_flight, **ev.queued}.items() if n}
    checks.append(
        Check(
            "nothing in flight, queues empty",
            not busy,
            ", ".join(f"{k} {n}" for k, n in {**ev.in_flight, **ev.queued}.items()),
        )
    )
    return checks


def _commits_match_executions(ev: Evidence, v: dict[str, Verdict]) -> Check:
    """Each commit carries the value of a run that finished at that fence (the journal
    has its ``end``): the result is never one that no execution produced."""
    ends = {(e.task_id, e.fence) for e in ev.executions if e.event == "end"}
    bad = []
    for task_id, verdict in v.items():
        if verdict.status != COMMITTED_ONCE:
            continue
        fence = _result_fence(ev.outcomes.get(task_id))
        if fence is None or fence != verdict.commits[0] or (task_id, fence) not in ends:
            bad.append(task_id)
    only_result = sum(1 for x in v.values() if x.from_result_only)
    detail = f"{len(bad)} mismatched" + (f": {_ids(sorted(bad))}" if bad else "")
    if only_result:
        detail += f"; {only_result} commit(s) known from the result key only (log line lost)"
    return Check("every commit is a recorded execution's, at its fence", not bad, detail)


def passed(checks: list[Check]) -> bool:
    return all(c.ok for c in checks)
