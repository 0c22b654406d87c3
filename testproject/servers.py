"""What every private server of the test tooling shares: Redis (and the Redis Cluster's
nodes, which are Redis servers), PostgreSQL, RabbitMQ and Prometheus.

Each runs on a free port of 127.0.0.1 with a directory of its own (a temp dir when none
is given, removed on ``stop()``), is ready only once it answers its own protocol, is
signalled only by the PID it was started with, and, when it exits before it is ready,
fails with the tail of its log in the message. Subclasses say how to start one, how to
see it answer, and how to stop it (SIGTERM suits Redis and Prometheus; PostgreSQL wants
SIGINT, RabbitMQ ``rabbitmqctl stop``); this class holds the rest, so that a fix to
readiness, log tails or clean-up lands once. Nothing here talks to a server it did not
start: a machine's own Redis, PostgreSQL, RabbitMQ or Prometheus is never touched.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, ClassVar, Self, TypeVar

T = TypeVar("T")


def free_port() -> int:
    """A TCP port of 127.0.0.1 nothing listens on at the moment of the call."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def poll(predicate: Callable[[], T | None], timeout_s: float, what: str) -> T:
    """The first value of ``predicate()`` that is not None; TimeoutError naming ``what``
    after ``timeout_s``. (``harness.wait_until``, typed, for the servers' readiness.)"""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.1f}s waiting for {what}")
        time.sleep(0.05)


def stop_process(process: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM a server this tooling started, SIGKILL it if it lingers, reap it."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
    if process.stderr:
        process.stderr.close()


class PrivateServer:
    """A server process of the test tooling's own, known by the PID it was started with.

    Subclasses are dataclasses with the fields ``directory`` (``Path | None``),
    ``port`` and ``process``, and give ``program`` (named in messages), ``error`` (the
    exception a failed start raises), ``log_name`` (its log, in ``directory``),
    ``start()``, ``_answers()`` (one readiness probe) and, where SIGTERM is not how it
    stops, ``stop()``. A context manager: ``with Server(...) as server:`` starts it
    (unless it runs) and stops it.
    """

    program: ClassVar[str] = "server"
    error: ClassVar[type[Exception]] = RuntimeError
    log_name: ClassVar[str] = "server.log"

    directory: Path | None
    port: int
    process: subprocess.Popen[bytes] | None
    _own_directory: bool = False
    _log: IO[bytes] | None = None

    @property
    def pid(self) -> int:
        """The PID it was started with: the only process any of its signals go to."""
        if self.process is None:
            raise self.error(f"{self.program} was never started")
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def log_path(self) -> Path:
        if self.directory is None:
            raise self.error(f"{self.program} has no directory before start()")
        return self.directory / self.log_name

    def log_tail(self, chars: int = 2000) -> str:
        """The end of its log: what a failed start says about itself."""
        if self.directory is None:
            return ""
        log = self.log_path
        return log.read_text(errors="replace")[-chars:] if log.exists() else ""

    def _check_alive(self) -> None:
        """Raise ``error`` with the log's tail if it was never started or has exited."""
        if self.process is None:
            raise self.error(f"{self.program} was never started")
        if self.process.poll() is not None:
            raise self.error(
                f"{self.program} exited with {self.process.returncode}:\n{self.log_tail()}"
            )

    def _answers(self) -> bool:
        """One readiness probe: True once it answers its own protocol."""
        raise NotImplementedError

    def _ready(self) -> bool | None:
        self._check_alive()  # an exit fails at once, with its log, not at the timeout
        return True if self._answers() else None

    def _wait_ready(self, timeout_s: float) -> None:
        poll(self._ready, timeout_s, f"{self.program} on port {self.port}")

    def _make_temp_directory(self, base: Path | None = None) -> Path:
        """A new temp dir of its own (removed by ``_release``), when none was given."""
        prefix = f"relier-{self.program.split('-')[0].lower()}-"
        self.directory = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
        self._own_directory = True
        return self.directory

    def _open_log(self) -> IO[bytes]:
        """Its log file, appended to: a file, not a pipe, which a server would stall on
        once full."""
        if self._log is None:
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the server
        return self._log

    def _release(self) -> None:
        """After the process is gone: close the log, remove a directory made for it."""
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._own_directory and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory, self._own_directory = None, False

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        """SIGTERM, SIGKILL if it lingers, reap; then release its log and directory."""
        stop_process(self.process)
        self._release()

    def close(self) -> None:
        """The same as ``stop()``."""
        self.stop()

    def __enter__(self) -> Self:
        return self if self.alive() else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
