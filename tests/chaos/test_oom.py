"""An OOM-killed task is recorded as ``oom`` and quarantined by its ``max_resurrections``
policy by cause (``demo.hog``: ``{"oom": 0, "default": 3}``), while another death of the
same task is resurrected. Real workers, a real memory limit: a memory cgroup the test
creates under its own (the kernel's OOM killer SIGKILLs the pool process), or, where no
cgroup can be made (not root, no writable memory controller), ``RLIMIT_AS`` on the pool
process (the allocation raises MemoryError, which relier hands off as an ``oom`` death).
The first test says which limit it used in its id (``[cgroup]`` or ``[rlimit]``); the
second always uses ``RLIMIT_AS``, so on a machine that allows cgroups both paths run."""

from __future__ import annotations

import contextlib
import itertools
import os
import resource
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from relier_django.core.dlq.store import DeadLetterStore
from relier_django.core.model import config
from relier_django.core.recovery.resurrector import Resurrector
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from testproject.celery import app
from testproject.demo import tasks
from testproject.harness import CeleryWorker, wait_until
from tests.chaos.test_death_cause import FAST, causes
from tests.chaos.test_resurrection import executions, running_pid

KEYS = KeySpace("rl")
MIB = 1 << 20
HEADROOM = 192 * MIB  # over what the idle worker uses: the hog's 1 GiB never fits
HOG_MIB = 1024
_names = itertools.count()


def _child_cgroup() -> tuple[Path, str] | None:
    """A new memory cgroup under this process's own, with the name of its limit file,
    or None where none can be made."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    name = f"relier-oom-{os.getpid()}-{next(_names)}"
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "memory":  # cgroup v1
            base, limit = Path("/sys/fs/cgroup/memory") / path.strip("/"), "memory.limit_in_bytes"
        elif controllers == "":  # cgroup v2: works where memory is delegated to children
            base, limit = Path("/sys/fs/cgroup") / path.strip("/"), "memory.max"
        else:
            continue
        child = base / name
        try:
            child.mkdir()
        except OSError:
            continue
        if (child / limit).exists() and os.access(child / limit, os.W_OK):
            return child, limit
        child.rmdir()
    return None


def _cgroups_work() -> bool:
    """Whether this machine lets the test make a memory cgroup (tried, then removed)."""
    found = _child_cgroup()
    if found is not None:
        found[0].rmdir()
    return found is not None


# What the first test uses, in its id: [cgroup] where the machine allows it, else [rlimit].
MACHINE_LIMIT = "cgroup" if _cgroups_work() else "rlimit"


def _limit_cgroup(child: Path, limit: str) -> None:
    usage = child / (
        "memory.usage_in_bytes" if limit == "memory.limit_in_bytes" else "memory.current"
    )
    cap = int(usage.read_text()) + HEADROOM
    (child / limit).write_text(str(cap))
    # Where swap exists, memory and swap together are capped too: the hog must not
    # page out instead of being killed.
    for swap in ("memory.memsw.limit_in_bytes", "memory.swap.max"):
        with contextlib.suppress(OSError):
            (child / swap).write_text(str(cap) if swap.startswith("memory.memsw") else "0")


def _limit_address_space(pid: int) -> None:
    soft = psutil.Process(pid).memory_info().vms + HEADROOM
    _, hard = resource.prlimit(pid, resource.RLIMIT_AS)
    resource.prlimit(pid, resource.RLIMIT_AS, (soft, hard))


@pytest.fixture
def limited_worker(worker_factory) -> Iterator[Callable[[str], CeleryWorker]]:  # type: ignore[no-untyped-def]
    """Starts a one-process worker whose pool process has a memory limit, ``"cgroup"``
    (the worker started inside a new memory cgroup) or ``"rlimit"`` (``RLIMIT_AS`` set
    on its pool process). No embedded scanner: the test runs the pass itself, once the
    main process has reported the death (as test_death_cause.py does)."""
    made: list[tuple[CeleryWorker, Path]] = []
    env = {**FAST, "RELIER_EMBEDDED_RESURRECTOR": "false"}

    def start(kind: str) -> CeleryWorker:
        if kind == "rlimit":
            worker = worker_factory(concurrency=1, extra_env=env)
            _limit_address_space(worker.children()[0].pid)
            return worker
        found = _child_cgroup()
        assert found is not None, "a memory cgroup could be made at collection, not now"
        child, limit = found
        worker = worker_factory(concurrency=1, extra_env=env, cgroup_procs=child / "cgroup.procs")
        made.append((worker, child))
        _limit_cgroup(child, limit)
        return worker

    yield start
    for worker, child in made:
        worker.kill()  # a cgroup with processes in it cannot be removed
        for _ in range(50):
            try:
                child.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def _quarantined_at_once(worker: CeleryWorker, label: str, reported: str) -> None:
    client = sync_client(config.current())
    receipt = tasks.hog.push(label, HOG_MIB)
    wait_until(lambda: reported.format(receipt.task_id) in worker.log_text(), 60,
               what="the OOM death reported")  # fmt: skip
    outcomes = Resurrector(app, config.current(), "test").run_pass().outcomes
    assert outcomes == {"dead_lettered": 1}  # not resurrected: its policy says oom: 0

    entry = DeadLetterStore(client, KEYS).get(receipt.task_id)
    assert entry is not None
    assert entry.data["reason"] == "resurrection_limit"
    assert entry.data["cause"] == "oom"
    assert "for its last death: oom" in entry.data["exc_message"]
    # The history the DLQ entry keeps: one death, fence 1, named oom.
    assert [(h["fence"], h["cause"]) for h in entry.history if h["event"] == "expired"] == [
        (1, "oom")
    ]
    assert executions(client, label) == [1]  # it ran once: an OOM loop stops at once


@pytest.mark.parametrize("kind", [MACHINE_LIMIT])
def test_an_oom_killed_task_is_recorded_and_quarantined_at_once(limited_worker, redis_client, kind):
    worker = limited_worker(kind)
    print(f"memory limit used: {kind}")  # also in the test's id
    if kind == "cgroup":
        reported = "pool process died running task_id={} fence=1: handed off"
    else:
        reported = "incarnation handed off task_id={} fence=1 death=oom"
    _quarantined_at_once(worker, f"oom-{kind}", reported)


def test_a_memory_error_under_rlimit_as_is_an_oom_death(limited_worker, redis_client):
    worker = limited_worker("rlimit")
    _quarantined_at_once(
        worker, "oom-rlimit-only", "incarnation handed off task_id={} fence=1 death=oom"
    )
    assert worker.alive() and len(worker.children()) == 1  # the pool process lives on


def test_the_same_policy_resurrects_a_task_whose_worker_was_lost(worker_factory, redis_client):
    worker_factory(name="survivor", queues=("elsewhere",), extra_env=FAST)
    doomed = worker_factory(name="doomed", queues=("celery",), extra_env=FAST)
    client = sync_client(config.current())
    receipt = tasks.hog.push("hog-lost-worker", 0, 30)
    running_pid(client, receipt.task_id)
    doomed.kill()

    assert receipt.get(timeout=30) == 2  # the default limit (3) applies: back, committed
    assert executions(client, "hog-lost-worker") == [1, 2]
    assert causes(client, receipt.task_id) == [(1, "connection_closed")]
