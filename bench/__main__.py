"""python -m bench [name ...]: every benchmark that exists (or the named ones), in one
run, each printing its table and writing JSON to bench/results/; then the report
(bench/results/REPORT.md, with the recovery-latency histogram)."""

import sys

from bench import (
    admission,
    audit_ledger,
    cluster_cost,
    delivery,
    dlq_pages,
    fleet,
    flow_control,
    parity,
    pop_trace,
    push_overhead,
    report,
    resurrector_pass,
    scheduling,
    store_cost,
    throughput,
    worker_memory,
    workflows,
)

# name -> (entry point, its command-line arguments)
BENCHMARKS = {
    "push_overhead": (push_overhead.main, []),
    "delivery": (delivery.main, ["--big"]),  # 500 x 5 kills, 2,000 x 10, then a disrupted round
    # Whole-worker SIGKILLs before and after take.lua: 50 idle, 50 at 200 pushes/s.
    "pop_trace": (pop_trace.main, []),
    "dlq_pages": (dlq_pages.main, []),  # 1,000,000 entries
    "admission": (admission.main, []),  # against the anchor, relier 0.1.7
    "throughput": (throughput.main, []),  # no-op and 10 ms tasks vs vanilla / acks_late
    # The RabbitMQ rounds: acks_late and relier on one private node, quorum queues.
    "delivery_rabbitmq": (delivery.main, ["--broker", "rabbitmq"]),  # 500 x 5 kills
    "throughput_rabbitmq": (throughput.main, ["--broker", "rabbitmq"]),  # 2,000 / 500 tasks
    "resurrector_pass": (resurrector_pass.main, []),  # 1,000 expired of 100,000
    "scheduling": (scheduling.main, []),  # 10,000 countdowns over 1-60 s vs Celery's ETA
    "workflows": (workflows.main, []),  # a chain step's cost over a plain push
    "store_cost": (store_cost.main, []),  # Redis CPU and commands per task, by script
    "store_cost_rabbitmq": (store_cost.main, ["--broker", "rabbitmq"]),  # the store alone
    # Redis CPU per task per master: the store on 1 and on 3 cluster masters, and plain.
    "cluster_cost": (cluster_cost.main, []),
    # An idle worker's PSS (main + 2 pool processes): Celery acks_late, relier, the anchor.
    "worker_memory": (worker_memory.main, []),
    # Idle fleets of 10, 50, 200 simulated workers x 8 processes: the store's Redis CPU,
    # commands, recovery after a process death; a modelled Celery fleet beside them.
    "fleet": (fleet.main, ["--celery"]),
    # Issue 37's figures against Celery acks_late in one run (after worker_memory and
    # fleet, whose results it prints beside its own).
    "parity": (parity.main, []),
    # The delivery ledger's Redis memory and command time per task (relier_audit).
    "audit_ledger": (audit_ledger.main, []),
    # Issue 38: per-key concurrency through whole-worker kills, the hand-over, a
    # cluster-wide rate, and no-op throughput against the build before flow control.
    "flow_control": (flow_control.main, []),
}

if __name__ == "__main__":
    chosen = sys.argv[1:] or list(BENCHMARKS)
    unknown = [name for name in chosen if name not in BENCHMARKS]
    if unknown:
        sys.exit(f"unknown benchmark(s) {unknown}; known: {sorted(BENCHMARKS)}")
    for name in chosen:
        entry, argv = BENCHMARKS[name]
        sys.argv = [f"bench.{name}", *argv]
        entry()
    report.main()  # bench/results/REPORT.md from every result on disk
