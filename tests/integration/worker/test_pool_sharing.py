"""An idle worker's pool processes share the main process's memory: what the main
process holds as it starts is frozen out of the garbage collector's reach before the
pool forks (``core/worker/forking.py``), and what only a web process needs
(``prometheus_client``, for the metrics endpoint) is never imported. The memory itself
is measured by ``bench/worker_memory.py`` (docs/benchmarks.md), not asserted here."""

from __future__ import annotations

import json

from testproject.celery import app

# Imported only where a page or the endpoint is served.
WEB_ONLY = ["prometheus_client", "relier_django.metrics.prometheus"]
FROZEN_AT_LEAST = 20_000


def _pool_states(redis_client, n: int) -> list[dict]:  # type: ignore[no-untyped-def]
    found: list[dict] = []
    for _ in range(n):
        app.send_task("probe.pool_state", args=["probe:pool", WEB_ONLY])
    for _ in range(n):
        popped = redis_client.blpop(["probe:pool"], timeout=30)
        assert popped is not None, "the probe task did not run"
        found.append(json.loads(popped[1]))
    return found


def test_pool_processes_inherit_the_main_process_objects_frozen(redis_client, worker_factory):
    worker_factory(extra_args=("--include", "tests.integration.worker.pool_probe_tasks"))
    states = _pool_states(redis_client, 4)
    # The interpreter starts with a few hundred objects frozen; the worker's main
    # process holds over a hundred thousand when it forks its pool.
    assert all(state["frozen"] > FROZEN_AT_LEAST for state in states), states


def test_no_pool_process_imports_what_only_the_web_needs(redis_client, worker_factory):
    worker_factory(extra_args=("--include", "tests.integration.worker.pool_probe_tasks"))
    states = _pool_states(redis_client, 4)
    assert all(state["imported"] == [] for state in states), states
