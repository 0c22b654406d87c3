"""python -m bench: every benchmark that exists, in one run (results in bench/results/)."""

import sys

from bench import push_overhead

BENCHMARKS = {"push_overhead": push_overhead.main}

if __name__ == "__main__":
    chosen = sys.argv[1:] or list(BENCHMARKS)
    unknown = [name for name in chosen if name not in BENCHMARKS]
    if unknown:
        sys.exit(f"unknown benchmark(s) {unknown}; known: {sorted(BENCHMARKS)}")
    sys.argv = sys.argv[:1]
    for name in chosen:
        BENCHMARKS[name]()
