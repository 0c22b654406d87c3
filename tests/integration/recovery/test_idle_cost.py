"""What idle scanners cost the store (issue 37), on a real Redis: three of relier's own
scanners (the loop every worker's main process runs), one leading, send few commands
per second between them. A regression guard on a count, not a timing: a loaded machine
makes the loops run late, which sends fewer commands, never more.

Before issue 37 the leader alone sent about 57 commands/s (TIME at every wake, the
schedule's head, the run id, the holders and the leader key at every check) and each
follower about 7; now about 13 and 3 (docs/scaling.md, ``python -m bench.fleet``)."""

from __future__ import annotations

import time

import redis

from relier_django.core.model import config
from relier_django.core.recovery.scanner import Scanner
from testproject.celery import app
from testproject.harness import wait_until

BUDGET_PER_S = 30  # leader + 2 followers, with room; before issue 37: about 70


def _calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def test_three_idle_scanners_send_under_thirty_commands_a_second(redis_client):
    scanners = [Scanner(app, config.current(), f"scanner:idle{i}@host") for i in range(3)]
    for scanner in scanners:
        scanner.duties = []  # the outbox relay's reads are the database's, not Redis's
    threads = [scanner.start_thread() for scanner in scanners]
    try:
        wait_until(lambda: sum(s._leads for s in scanners) == 1, 30, what="one leader")
        wait_until(lambda: all(s._leads or s.deaths.watching for s in scanners), 30,
                   what="the followers watching the leader")  # fmt: skip
        time.sleep(1.0)
        before, started = _calls(redis_client), time.monotonic()
        time.sleep(4.0)
        after, elapsed = _calls(redis_client), time.monotonic() - started
    finally:
        for scanner in scanners:
            scanner.stop()
        for thread in threads:
            thread.join(10)
    spent = {k: after[k] - before.get(k, 0) for k in after if after[k] > before.get(k, 0)}
    spent["info"] = spent.get("info", 0) - 1  # this test's own read
    per_s = sum(spent.values()) / elapsed
    assert per_s <= BUDGET_PER_S, f"{per_s:.1f} commands/s: {spent}"
    # The followers watch the leader's connection, not the whole list: the leader lists
    # 4 times a second, each follower watches twice.
    assert spent.get("client|list", 0) / elapsed <= 4 + 2 * 2 + 2, spent
