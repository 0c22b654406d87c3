"""`make demo` stopped by a signal other than Ctrl-C (a `timeout`, a closed terminal, a
supervisor) leaves no process behind: not its redis-server, not a Celery worker it
started in a session of its own, not a pool process of one.

The signal goes to the demo's PID only, as `timeout` and `kill` send it; everything it
started is listed with psutil beforehand (PID and start time, so a reused PID is never
mistaken for a survivor), whatever session it runs in.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from testproject.harness import REPO_ROOT, free_port, wait_until

# The demo gives its processes a warm shutdown, then SIGKILLs them (scripts/demo.py's
# STOP_DEADLINE_S); this leaves room for that and for a loaded CI machine.
GONE_WITHIN_S = 60

# Printed once both workers are ready and the resurrector is started.
WORKERS_UP = "heartbeat TTL"
# Printed once the report is out and runserver is started.
SERVING = "Press Ctrl-C"


class Demo:
    """``scripts/demo.py`` in a session of its own, its output in a file."""

    def __init__(self, run_dir: Path) -> None:
        self.output = run_dir / "demo.out"
        self._out = open(self.output, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [
                sys.executable, "scripts/demo.py", "--tasks", "6", "--settle-s", "2",
                "--port", str(free_port()), "--http-port", str(free_port()),
                "--run-dir", str(run_dir),
            ],
            cwd=REPO_ROOT, stdout=self._out, stderr=subprocess.STDOUT,
            start_new_session=True,  # the test's signal is the only one it gets
        )  # fmt: skip
        self.started: dict[int, float] = {}

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def wait_for(self, marker: str) -> None:
        def printed() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"the demo exited early:\n{self.text()}")
            return marker in self.text()

        wait_until(printed, 180, interval_s=0.2, what=f"the demo to print {marker!r}")

    def record_descendants(self) -> list[psutil.Process]:
        """Every process the demo started and theirs, recorded for the check and the
        clean-up."""
        found = psutil.Process(self.process.pid).children(recursive=True)
        for proc in found:
            with contextlib.suppress(psutil.NoSuchProcess):
                self.started[proc.pid] = proc.create_time()
        return found

    def survivors(self) -> list[str]:
        """The recorded processes still running, described."""
        alive = []
        for pid, created in self.started.items():
            proc = _same_process(pid, created)
            if proc is not None:
                with contextlib.suppress(psutil.NoSuchProcess):
                    alive.append(f"{pid} {' '.join(proc.cmdline())[:120]}")
        return alive

    def stop(self) -> None:
        """SIGKILL, by PID, the demo and whatever it started that is still running
        (and what those started since they were recorded)."""
        pids = [self.process.pid, *self.started]
        live = [p for pid in pids if (p := _same_process(pid, self.started.get(pid)))]
        for proc in list(live):
            with contextlib.suppress(psutil.NoSuchProcess):
                live += proc.children(recursive=True)
        for proc in live:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(live, timeout=10)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)
        self._out.close()


def _same_process(pid: int, created: float | None) -> psutil.Process | None:
    """The process ``pid`` if it is the one started at ``created`` and not a zombie."""
    try:
        proc = psutil.Process(pid)
        if created is not None and proc.create_time() != created:
            return None
        return None if proc.status() == psutil.STATUS_ZOMBIE else proc
    except psutil.NoSuchProcess:
        return None


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    running = Demo(tmp_path)
    try:
        yield running
    finally:
        running.stop()


def _workers(demo: Demo, found: list[psutil.Process]) -> list[psutil.Process]:
    """The worker main processes (their pool processes, forked, share their cmdline)."""
    return [
        p
        for p in found
        if p.ppid() == demo.process.pid and {"celery", "worker"} <= set(p.cmdline())
    ]


def _assert_all_gone_after(demo: Demo, sig: signal.Signals) -> None:
    os.kill(demo.process.pid, sig)
    try:
        demo.process.wait(GONE_WITHIN_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the demo still runs {GONE_WITHIN_S} s after {sig.name}:\n{demo.text()}")
    deadline = time.monotonic() + 5
    while demo.survivors() and time.monotonic() < deadline:
        time.sleep(0.1)  # a SIGKILLed process is gone a moment after the signal
    assert demo.survivors() == [], demo.text()
    # Died of the signal once its clean-up was done, as a supervisor expects.
    assert demo.process.returncode == -sig, demo.text()
    assert "All demo processes stopped." in demo.text()


def test_sigterm_while_workers_run_stops_every_process_the_demo_started(demo):
    demo.wait_for(WORKERS_UP)
    found = demo.record_descendants()
    workers = _workers(demo, found)
    # Two, unless the demo already got to SIGKILLing one (by design) on a slow machine.
    assert workers, demo.text()
    # The leak this proves gone: workers run in sessions of their own, out of reach
    # of a signal to the demo's process group.
    assert all(os.getsid(w.pid) != os.getsid(demo.process.pid) for w in workers)
    assert all(w.children() for w in workers), "each worker has its prefork pool"
    assert any(p.name() == "redis-server" for p in found)
    assert any("relier_resurrector" in p.cmdline() for p in found)

    _assert_all_gone_after(demo, signal.SIGTERM)


def test_sighup_while_serving_the_admin_stops_every_process_the_demo_started(demo):
    demo.wait_for(SERVING)
    found = demo.record_descendants()
    # One worker was SIGKILLed mid-flight by design; the other still runs.
    assert len(_workers(demo, found)) == 1, demo.text()
    assert any("runserver" in p.cmdline() for p in found)

    _assert_all_gone_after(demo, signal.SIGHUP)
