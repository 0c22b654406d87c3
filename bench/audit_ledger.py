"""What the delivery ledger (``relier_audit``, AUDIT_HORIZON_S) costs per task, in
Redis memory and Redis CPU, read from the server itself.

On a private Redis, the same pushes are made with the ledger on and off (no worker:
each task is stored and queued by ``push.lua``, which is where the ledger's note is
made). For each, from the server:

- ``INFO commandstats``: every command's calls and microseconds, the ones a script
  runs included (``XADD`` and ``PEXPIRE`` are the ledger's; ``HSET`` gains one call,
  the entry id kept in the task hash for ``abort.lua``), and ``EVALSHA``'s own time,
  which includes them: the push script's time per call on against off is the ledger's
  CPU per task. Microseconds move with the machine's load: compare within a run.
- ``MEMORY USAGE`` of the ledger stream, divided by the tasks it holds: what the ledger
  keeps per task for AUDIT_HORIZON_S; ``used_memory``'s growth per task, on against
  off, adds the entry id kept in the task hash until the task ends.
- One ``relier_audit`` reading of all of them: its commands per task.

    python -m bench.audit_ledger [--tasks 20000]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from bench.common import private_redis, setup_django, write_result


def _commandstats(client: Any) -> dict[str, dict[str, float]]:
    stats = client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): {"calls": v["calls"], "usec": v["usec"]}
        for name, v in stats.items()
    }


def _round(client: Any, tasks: int, ledger: bool) -> dict[str, Any]:
    from relier_django.core.model import config
    from relier_django.core.observe.audit import audit, now
    from relier_django.core.store.keys import KeySpace
    from testproject.demo import tasks as demo

    client.flushall()
    base = config.current()
    cfg = base.replace(audit_horizon_s=None if ledger else 0)
    config.override(cfg)
    try:
        keys = KeySpace.of(cfg)
        demo.noop.push()  # the scripts loaded, the clients connected
        client.flushall()
        client.config_resetstat()
        memory_before = client.info("memory")["used_memory"]
        for _ in range(tasks):
            demo.noop.push()
        memory_after = client.info("memory")["used_memory"]
        stats = _commandstats(client)
        ledger_bytes = client.memory_usage(keys.ledger, samples=0) or 0
        client.config_resetstat()
        found = audit(client, keys, now(client) - 3_600_000, slack_ms=3000)
        audit_stats = _commandstats(client)
    finally:
        config.override(None)
    evalsha = stats.get("evalsha", {"calls": 0, "usec": 0})
    return {
        "ledger": ledger,
        "tasks": tasks,
        "push_script_usec_per_call": evalsha["usec"] / max(1, evalsha["calls"]),
        "commands_per_task": {
            name: round(v["calls"] / tasks, 3) for name, v in sorted(stats.items())
        },
        "usec_per_task": {name: round(v["usec"] / tasks, 3) for name, v in sorted(stats.items())},
        "ledger_bytes": ledger_bytes,
        "ledger_bytes_per_task": round(ledger_bytes / tasks, 1),
        "used_memory_per_task": round((memory_after - memory_before) / tasks, 1),
        "audit": {
            "noted": found.noted,
            "in_flight": found.classes.get("in_flight", 0),
            "unexplained": found.unexplained,
            "commands_per_task": {
                name: round(v["calls"] / tasks, 3) for name, v in sorted(audit_stats.items())
            },
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    options = parser.parse_args()
    with private_redis() as server:
        setup_django(server.url)
        client = server.client(decode_responses=True)
        rounds = [_round(client, options.tasks, ledger) for ledger in (False, True, False, True)]
    on = [r for r in rounds if r["ledger"]]
    off = [r for r in rounds if not r["ledger"]]

    def mean(rs: list[dict[str, Any]], key: str) -> float:
        return sum(r[key] for r in rs) / len(rs)

    summary = {
        "tasks": options.tasks,
        "ledger_bytes_per_task": mean(on, "ledger_bytes_per_task"),
        "used_memory_per_task_on": mean(on, "used_memory_per_task"),
        "used_memory_per_task_off": mean(off, "used_memory_per_task"),
        "push_script_usec_on": round(mean(on, "push_script_usec_per_call"), 2),
        "push_script_usec_off": round(mean(off, "push_script_usec_per_call"), 2),
        "xadd_usec_per_task": round(sum(r["usec_per_task"].get("xadd", 0) for r in on) / 2, 3),
        "pexpire_usec_per_task": round(
            sum(r["usec_per_task"].get("pexpire", 0) for r in on) / 2, 3
        ),
    }
    name = "audit_ledger" if options.tasks == 20_000 else "audit_ledger-small"
    path = write_result(name, {"summary": summary, "rounds": rounds})
    print(json.dumps(summary, indent=2))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
