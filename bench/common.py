"""Shared helpers: a private Redis (and RabbitMQ node), Django pointed at them,
percentiles, results files."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
sys.path.insert(0, str(REPO))

from testproject.harness import RedisServer, process_pointed_at, worker_env  # noqa: E402
from testproject.rabbitmq import RabbitServer  # noqa: E402

# A worker's logging as a project runs it: the testproject logs relier's runner at DEBUG
# for its tests (a line per commit); Django's default logging does not.
AS_SHIPPED = {"TESTPROJECT_RUNNER_LOG_LEVEL": "INFO"}
# The RabbitMQ rounds' queues: quorum, the type RabbitMQ offers for messages that must
# survive a node (docs/chaos.md, rabbitmq-delivery); the same for every contender.
QUEUE_TYPE = "quorum"


@contextlib.contextmanager
def private_redis() -> Iterator[RedisServer]:
    with tempfile.TemporaryDirectory(prefix="relier-bench-") as tmp:
        server = RedisServer(directory=Path(tmp)).start()
        try:
            yield server
        finally:
            server.stop()


@contextlib.contextmanager
def private_rabbitmq() -> Iterator[RabbitServer]:
    """A private RabbitMQ node (testproject/rabbitmq.py), stopped by PID on exit."""
    with (
        tempfile.TemporaryDirectory(prefix="relier-bench-rabbitmq-") as tmp,
        RabbitServer(Path(tmp)) as node,
    ):
        yield node


def rabbitmq_env(node: RabbitServer, queue: str, extra: Mapping[str, str]) -> dict[str, str]:
    """A contender's worker environment ``extra`` with Celery's broker on ``node``:
    kombu's AMQP transport whatever the contender runs on Redis, ``QUEUE_TYPE`` queues,
    ``queue`` as its default queue and ``<queue>.recovery`` as relier's recovery
    queue, so that no round consumes another's leftovers."""
    env = {name: value for name, value in extra.items() if name != "CELERY_BROKER_TRANSPORT"}
    return {
        **env,
        "CELERY_BROKER_URL": node.url,
        "CELERY_TASK_DEFAULT_QUEUE_TYPE": QUEUE_TYPE,
        "CELERY_TASK_DEFAULT_QUEUE": queue,
        "RELIER_RECOVERY_QUEUE": f"{queue}.recovery",
    }


@contextlib.contextmanager
def producer_on(env: Mapping[str, str]) -> Iterator[None]:
    """This process's pushes follow ``env`` (from ``rabbitmq_env``) until the block ends:
    its broker, queue type, default and recovery queues. Enter it after
    ``setup_django``, which points the environment at Redis."""
    conf = {
        "task_default_queue_type": env["CELERY_TASK_DEFAULT_QUEUE_TYPE"],
        "task_default_queue": env["CELERY_TASK_DEFAULT_QUEUE"],
    }
    with process_pointed_at(env, **conf):
        yield


def setup_django(redis_url: str, broker_url: str | None = None) -> None:
    os.environ.update(worker_env(redis_url))
    if broker_url is not None:  # Celery's broker on its own server
        os.environ["CELERY_BROKER_URL"] = broker_url
    import django

    django.setup()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary_ms(samples_s: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in samples_s]
    return {
        "n": len(ms),
        "p50_ms": round(percentile(ms, 50), 4),
        "p99_ms": round(percentile(ms, 99), 4),
        "mean_ms": round(statistics.fmean(ms), 4),
    }


def command_counts(client) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def diff_counts(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0) > 0}


def machine() -> dict[str, object]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_result(name: str, data: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **data}, indent=2) + "\n")
    return path
