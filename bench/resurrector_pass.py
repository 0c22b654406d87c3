"""One resurrector pass over 1,000 expired tasks among 100,000 in flight.

100,000 tasks are stored through the real ``push.lua`` (pipelined, so filling is
quick); then 1,000 of them get a deadline in the past in the expiry index, which is
exactly what an expired heartbeat or queued grace looks like to a scanner. One pass of
the real ``Resurrector`` then runs: it reads the index by score, leases and re-fences
each expired task with ``resurrect.lua``, publishes its envelope to the recovery queue
through Celery, and records the resurrection with ``resurrected.lua``.

The store (relier's Redis) and Celery's broker are two private redis-servers here, so
the two costs are told apart. Reported: the pass's wall time, and its Redis time: the
CPU time each redis-server process (all its threads) spent during the pass, from
``/proc/<pid>/task/*/schedstat`` (nanoseconds; it covers parsing, networking and
scripts, and nothing the server did not do). ``INFO commandstats`` gives the commands
the store executed, those run inside scripts included. Target (issue 8): <= 50 ms of
Redis time, judged here on store + broker together (one Redis serves both in the
common deployment).

    python -m bench.resurrector_pass [--in-flight 100000] [--expired 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import time
import uuid
from pathlib import Path

from bench.common import private_redis, setup_django, write_result

FILL_BATCH = 2_000


def redis_calls(client) -> dict[str, tuple[int, int]]:
    """Per command: (calls, microseconds Redis spent executing them). A script's time
    includes the commands it ran, which are also counted under their own names."""
    stats = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"])) for k, v in stats.items()}


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of ``pid`` so far, in ns (first field of schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        total += int((task / "schedstat").read_text().split()[0])
    return total


def main_thread_ns(pid: int) -> int:
    """CPU time of the main thread of ``pid`` so far, in ns: for redis-server, the
    thread that runs commands and scripts (the others fsync and close AOF files)."""
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0])


def fill(client, keys, n: int) -> list[str]:
    from relier_django.core.model.envelope import Envelope
    from relier_django.core.push import idempotency
    from relier_django.core.store import scripts

    ids = []
    created_ms = int(time.time() * 1000)
    for start in range(0, n, FILL_BATCH):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(n, start + FILL_BATCH)):
            env = Envelope(id=uuid.uuid4().hex, task="demo.work", args=(f"t{i}", 0.0),
                           queue="", created_ms=created_ms)  # fmt: skip
            call = idempotency.store(keys, env, env.encode(), 3_600_000, 3)
            pipe.evalsha(scripts.PUSH.sha, len(call.keys), *call.keys, *call.args)
            ids.append(env.id)
        pipe.execute()
    return ids


def one_round(server, broker, in_flight: int, expired: int) -> dict[str, float]:
    from relier_django.core.model import config
    from relier_django.core.recovery.resurrector import Resurrector
    from relier_django.core.store import scripts
    from relier_django.core.store.keys import KeySpace
    from testproject.celery import app

    client = server.client(decode_responses=True)
    client.flushall()
    cfg = config.current().replace(resurrect_batch=max(expired, 1))
    keys = KeySpace.of(cfg)
    client.script_load(scripts.PUSH.source)
    filling = time.perf_counter()
    ids = fill(client, keys, in_flight)
    fill_s = time.perf_counter() - filling
    assert client.zcard(keys.expiry) == in_flight
    seconds, _ = client.time()
    client.zadd(keys.expiry, {task_id: (int(seconds) - 60) * 1000 for task_id in ids[:expired]})
    resurrector = Resurrector(app, cfg, "bench")
    resurrector.client.ping()  # connect before timing
    with app.producer_or_acquire() as producer:  # warm the broker connection
        producer.connection.ensure_connection()
    rewrites_before = client.info("persistence")
    calls_before = redis_calls(client)
    broker_client = broker.client()
    broker_calls_before = redis_calls(broker_client)
    main_before = main_thread_ns(server.pid)
    cpu_before, broker_before = cpu_ns(server.pid), cpu_ns(broker.pid)
    report = resurrector.run_pass()
    cpu_after, broker_after = cpu_ns(server.pid), cpu_ns(broker.pid)
    main_after = main_thread_ns(server.pid)
    rewrites_after = client.info("persistence")
    stats = {
        k: (n - calls_before.get(k, (0, 0))[0], us - calls_before.get(k, (0, 0))[1])
        for k, (n, us) in redis_calls(client).items()
    }
    stats.pop("info", None)  # the measurement's own
    broker_calls = {
        k: n - broker_calls_before.get(k, (0, 0))[0]
        for k, (n, _) in redis_calls(broker_client).items()
        if k != "info"
    }
    calls = {k: n for k, (n, _) in stats.items()}
    scripts_us = sum(us for k, (_, us) in stats.items() if k in ("evalsha", "eval"))
    other_us = sum(us for k, (_, us) in stats.items() if k not in ("evalsha", "eval"))
    inner_us = sum(
        us for k, (_, us) in stats.items() if k not in ("evalsha", "eval", "zrangebyscore", "time")
    )
    assert report.resurrected == expired, report
    assert client.zcard(keys.expiry) == in_flight  # re-armed, not dropped
    assert broker.client().llen(cfg.recovery_queue) == expired  # every one re-published
    store_ms = (cpu_after - cpu_before) / 1e6
    # An AOF rewrite of the fill (it passes auto-aof-rewrite-min-size near its end, in
    # round 1 above all) can overlap the pass: its child is another process and not
    # counted, but copy-on-write faults in the main thread and the background threads
    # that fsync and drop the old files are, within store_ms.
    aof_rewrite = bool(
        rewrites_before["aof_rewrite_in_progress"]
        or rewrites_after["aof_rewrite_in_progress"]
        or rewrites_after["aof_rewrites"] != rewrites_before["aof_rewrites"]
    )
    broker_ms = (broker_after - broker_before) / 1e6
    return {
        "fill_s": round(fill_s, 1),
        "wall_ms": round(report.seconds * 1000, 1),
        "store_ms": round(store_ms, 2),
        "store_main_thread_ms": round((main_after - main_before) / 1e6, 2),
        "aof_rewrite_during_pass": aof_rewrite,
        "broker_ms": round(broker_ms, 2),
        "redis_ms": round(store_ms + broker_ms, 2),
        "commands": sum(calls.values()),
        # Redis's own clock on command execution: what is left of store_ms is parsing,
        # networking and the event loop (the cost of a round trip).
        "store_exec_ms": round((scripts_us + other_us - inner_us) / 1000, 2),
        "scripts_ms": round(scripts_us / 1000, 2),
        "by_command": {k: c for k, c in sorted(calls.items()) if c},
        "usec_by_command": {k: us for k, (n, us) in sorted(stats.items()) if n},
        "broker_by_command": {k: c for k, c in sorted(broker_calls.items()) if c},
    }


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--in-flight", type=int, default=100_000)
    parser.add_argument("--expired", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rounds = []
    with private_redis() as server, private_redis() as broker:
        setup_django(server.url, broker_url=broker.url)
        for n in range(args.rounds):
            broker.client().flushall()
            result = one_round(server, broker, args.in_flight, args.expired)
            rounds.append(result)
            print(f"round {n + 1}: pass wall {result['wall_ms']} ms, Redis time "
                  f"{result['redis_ms']} ms (store {result['store_ms']} ms over "
                  f"{result['commands']} commands, of which main thread "
                  f"{result['store_main_thread_ms']} ms and executing commands "
                  f"{result['store_exec_ms']} ms; broker {result['broker_ms']} ms)"
                  + (" [an AOF rewrite overlapped the pass]"
                     if result["aof_rewrite_during_pass"] else ""))  # fmt: skip
    best = min(r["redis_ms"] for r in rounds)
    worst = max(r["redis_ms"] for r in rounds)
    verdict = "met" if worst <= 50 else "MISSED"
    print(f"\n{args.expired} expired among {args.in_flight} in flight: Redis time per pass "
          f"{best}-{worst} ms (target <= 50 ms: {verdict})")  # fmt: skip
    data = {"in_flight": args.in_flight, "expired": args.expired, "rounds": rounds,
            "redis_ms_worst": worst, "target_redis_ms": 50,
            "target_met": verdict == "met"}  # fmt: skip
    path = write_result("resurrector_pass", data)
    print(f"results: {path}")
    return data


if __name__ == "__main__":
    main()
