"""DLQ listing at scale: page latency at the top and deep down, under each filter.

Fills a private Redis with --entries DLQ entries through the real dead_letter.lua
(pipelined), spread over 20 task names and 4 reasons, then times one page of 50 from
the top and from a cursor deep in the index, under filters. The claim checked: a page
costs the same at depth 900,000 as at the top, with or without a filter (cursor paging
is O(log N + page)), and counts are one small hash read.

    python -m bench.dlq_pages [--entries 1000000] [--samples 300]
"""

from __future__ import annotations

import argparse
import time

from bench.common import private_redis, summary_ms, write_result

TASKS = [f"shop.task_{i:02d}" for i in range(20)]


def fill(client, keys, n: int) -> float:
    from relier_django.core.dlq import dead_letter as dlq
    from relier_django.core.model.failure import Failure, Reason
    from relier_django.core.store import scripts

    reasons = [Reason.EXCEPTION, Reason.RETRIES_EXHAUSTED, Reason.HARD_TIMEOUT, Reason.UNKNOWN_TASK]
    client.script_load(scripts.DEAD_LETTER.source)
    started = time.perf_counter()
    batch = 2000
    for base in range(0, n, batch):
        pipe = client.pipeline(transaction=False)
        for i in range(base, min(n, base + batch)):
            failure = Failure(reasons[i % 4], "ValueError", f"order {i} failed")
            call = dlq.dead_letter(
                keys, failure, 60_000, env=None, raw=f'{{"order": {i}}}', queue="default",
                task=TASKS[i % len(TASKS)],
            )  # fmt: skip
            pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
        pipe.execute()
        if base % 100_000 == 0:
            print(f"  filled {base:>9,} / {n:,}", flush=True)
    return time.perf_counter() - started


def timed(fn, samples: int) -> dict[str, float]:
    fn()  # warm up (connection, code paths)
    runs = []
    for _ in range(samples):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return summary_ms(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=300)
    args = parser.parse_args()

    with private_redis() as server:
        import redis

        from relier_django.core.dlq.store import Cursor, DeadLetterStore, Query, lex_range
        from relier_django.core.store.keys import KeySpace

        keys = KeySpace("rl")
        client = redis.Redis.from_url(server.url, decode_responses=True)
        mem0 = int(client.info("memory")["used_memory"])
        print(f"filling {args.entries:,} DLQ entries through dead_letter.lua ...", flush=True)
        fill_s = fill(client, keys, args.entries)
        mem1 = int(client.info("memory")["used_memory"])
        store = DeadLetterStore(client, keys)
        depth = int(args.entries * 0.9)
        # One O(N) walk, only to find a cursor that deep; a real caller gets it from a page.
        everything = lex_range(Query(), None)
        deep = Cursor.after(client.zrangebylex(keys.dlq_lex, *everything, start=depth, num=1)[0])
        task, reason = TASKS[3], "unknown_task"  # entry i has TASKS[i % 20], reasons[i % 4]
        cases = {
            "top page, no filter": lambda: store.page(Query(), None, 50),
            f"page at depth {depth:,}, no filter": lambda: store.page(Query(), deep, 50),
            "top page, by task": lambda: store.page(Query(task=task), None, 50),
            f"page at depth {depth:,}, by task": lambda: store.page(Query(task=task), deep, 50),
            "top page, by task and reason": lambda: store.page(
                Query(task=task, reason=reason), None, 50
            ),
            # The index step alone, without reading the 50 summaries: a rank offset
            # on the time index is O(log N) too (Redis skiplists keep spans), but only
            # unfiltered; a filtered offset would have to read every entry above it.
            f"index step only: cursor at depth {depth:,}, by task": lambda: client.zrangebylex(
                keys.dlq_lex, *lex_range(Query(task=task), deep), start=0, num=51
            ),
            f"index step only: rank offset {depth:,}, no filter": lambda: client.zrevrange(
                keys.dlq, depth, depth + 49
            ),
            "counts (by task, reason, both)": store.counts,
        }
        results = {}
        print(f"\n{'case':<62} {'p50 ms':>8} {'p99 ms':>8}")
        for name, fn in cases.items():
            results[name] = timed(fn, args.samples)
            print(f"{name:<62} {results[name]['p50_ms']:>8.3f} {results[name]['p99_ms']:>8.3f}")
        assert store.size() == args.entries and store.counts().total == args.entries
        top = results["top page, no filter"]["p50_ms"]
        deep_ms = results[f"page at depth {depth:,}, no filter"]["p50_ms"]
        per_entry = (mem1 - mem0) / args.entries
        print(
            f"\ndeep/top page ratio (p50): {deep_ms / top:.2f}   fill: {fill_s:.1f} s "
            f"({args.entries / fill_s:,.0f} entries/s)   memory: {per_entry:,.0f} B/entry"
        )
        path = write_result(
            "dlq_pages",
            {
                "entries": args.entries,
                "page_size": 50,
                "depth": depth,
                "fill_s": round(fill_s, 2),
                "bytes_per_entry": round(per_entry),
                "deep_over_top_p50": round(deep_ms / top, 3),
                "cases": results,
            },
        )
        print(f"results: {path}")


if __name__ == "__main__":
    main()
