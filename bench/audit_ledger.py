"""What the delivery ledger (``relier_audit``, AUDIT_HORIZON_S) costs per task, in
Redis memory and Redis CPU, read from the server itself.

On a private Redis, the same pushes are made with the ledger on and off (no worker:
each task is stored and queued by ``push.lua``, which is where the ledger's note is
made). For each, from the server:

- ``INFO commandstats``: every command's calls and microseconds, the ones a script
  runs included (``XADD`` and ``PEXPIRE`` are the ledger's), and ``EVALSHA``'s time,
  which includes them. Microseconds move with the machine's load, and between rounds
  the load moves: the figure to read is the ledger's commands' share of the push
  script's time within each round (medians over alternating rounds).
- ``MEMORY USAGE`` of the ledger stream, divided by the tasks it holds: what the ledger
  keeps per task for AUDIT_HORIZON_S (``used_memory``'s growth per task, on against
  off, says the same within the allocator's rounding).
- One ``relier_audit`` reading of all of them: its commands per task.

    python -m bench.audit_ledger [--tasks 10000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
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
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3, help="of each mode, alternating")
    options = parser.parse_args()
    with private_redis() as server:
        setup_django(server.url)
        client = server.client(decode_responses=True)
        modes = [False, True] * options.rounds
        rounds = [_round(client, options.tasks, ledger) for ledger in modes]
    on = [r for r in rounds if r["ledger"]]
    off = [r for r in rounds if not r["ledger"]]

    def median(rs: list[dict[str, Any]], value: Any) -> float:
        return round(statistics.median(value(r) for r in rs), 3)

    def ledger_usec(r: dict[str, Any]) -> float:
        return float(r["usec_per_task"].get("xadd", 0) + r["usec_per_task"].get("pexpire", 0))

    summary = {
        "tasks": options.tasks,
        "rounds": options.rounds,
        "ledger_bytes_per_task": median(on, lambda r: r["ledger_bytes_per_task"]),
        "used_memory_per_task_on": median(on, lambda r: r["used_memory_per_task"]),
        "used_memory_per_task_off": median(off, lambda r: r["used_memory_per_task"]),
        "push_script_usec_on": median(on, lambda r: r["push_script_usec_per_call"]),
        "push_script_usec_off": median(off, lambda r: r["push_script_usec_per_call"]),
        # Within one round, so the machine's load moves both alike: the ledger's
        # commands' share of the push script's own time.
        "ledger_usec_per_task": median(on, ledger_usec),
        "ledger_share_of_push_script": median(
            on, lambda r: ledger_usec(r) / r["push_script_usec_per_call"]
        ),
    }
    name = "audit_ledger" if options.tasks == 10_000 else "audit_ledger-small"
    path = write_result(name, {"summary": summary, "rounds": rounds})
    print(json.dumps(summary, indent=2))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
