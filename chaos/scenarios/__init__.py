"""The scenarios, in the order ``run all`` runs them.

Each one is a function of a :class:`~chaos.runner.Run` that starts what it needs,
pushes its workload and injects its fault; the runner then waits for quiescence and
checks the shared invariants plus the scenario's own (``run.verify``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..report import Report
from ..runner import Options, Run, execute

EnvSpec = Mapping[str, str] | Callable[[Options], Mapping[str, str]]


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str  # one line, for `list` and the report
    body: Callable[[Run], None]
    env: EnvSpec = field(default_factory=dict)  # RELIER_*/CELERY_* for every process
    setup: Callable[[Run], Mapping[str, Any] | None] | None = None
    celery: Mapping[str, Any] = field(default_factory=dict)  # Celery settings of the producer

    def env_for(self, opts: Options) -> dict[str, str]:
        return dict(self.env(opts) if callable(self.env) else self.env)

    def run(self, opts: Options) -> Report:
        return execute(
            self.name, self.summary, self.body, opts, self.env_for(opts), self.setup, self.celery
        )


def _all() -> dict[str, Scenario]:
    from . import (
        cluster,
        kills,
        load,
        messages,
        network,
        periodic,
        rabbitmq,
        redis_faults,
        scheduling,
        workflows,
    )

    ordered = [
        kills.WORKER_KILL,
        kills.ZOMBIE,
        kills.GRACEFUL_DEPLOY,
        network.NETWORK_PARTITION,
        redis_faults.REDIS_RESTART,
        redis_faults.REDIS_FAILOVER,
        messages.TASK_CORRUPT,
        load.LOAD_SPIKE,
        load.SLOW_TASK,
        kills.POISON,
        scheduling.SCHEDULED_KILLS,
        scheduling.SCHEDULED_REDIS_RESTART,
        periodic.PERIODIC_LEADER_KILL,
        workflows.WORKFLOWS,
        rabbitmq.RABBITMQ_DELIVERY,
        cluster.CLUSTER_DELIVERY,
    ]
    return {s.name: s for s in ordered}


SCENARIOS: dict[str, Scenario] = _all()
