"""worker/forking.py: the worker's main process collects, then freezes, what it holds
just before its prefork pool forks the first pool process, and only then. The real
thing (the objects a pool process inherits frozen) is
tests/integration/worker/test_pool_sharing.py; the memory it saves, bench/worker_memory.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from celery import signals

from relier_django.core.worker import forking, hooks

pytestmark = pytest.mark.unit


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What ``forking`` asked of the garbage collector (this process's is left alone)."""
    made: list[str] = []
    fake = SimpleNamespace(
        collect=lambda: made.append("collect"), freeze=lambda: made.append("freeze")
    )
    monkeypatch.setattr(forking, "gc", fake)
    monkeypatch.setattr(forking, "_frozen", False)
    return made


def test_the_main_process_collects_then_freezes_before_the_pools_first_fork(calls):
    hooks.connect()
    signals.worker_before_create_process.send(sender=None)  # prefork, before each fork
    assert calls == ["collect", "freeze"]


def test_later_forks_freeze_nothing_more(calls):
    """A pool process replaced later would freeze the work in flight then, for good."""
    hooks.connect()
    for _ in range(3):
        signals.worker_before_create_process.send(sender=None)
    assert calls == ["collect", "freeze"]
