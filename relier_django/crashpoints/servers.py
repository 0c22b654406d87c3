"""The plugin's private servers: a ``redis-server`` on a free port in a directory of
its own, and a crash-testing Celery worker of the user's project. Each is a subprocess
the plugin started, in its own process group, stopped by its PID: the plugin never
touches a server or a worker it did not start.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

# A crash-testing worker's timings: a dead pool process is seen at once (its Redis
# connection closes); the heartbeat TTL is the bound for everything else.
FAST_RECOVERY: dict[str, str] = {
    "RELIER_HEARTBEAT_TTL_S": "1.5",
    "RELIER_SCAN_INTERVAL_S": "0.3",
    "RELIER_LEADER_LEASE_S": "2",
}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.05)


def _stop(process: subprocess.Popen[bytes] | None, grace_s: float) -> None:
    """SIGTERM ``process``, SIGKILL its process group after ``grace_s``."""
    if process is None:
        return
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # its own group (start_new_session)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(10)


@dataclass
class PrivateRedis:
    """A ``redis-server`` of the plugin's own: AOF everysec, ``noeviction``."""

    directory: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> PrivateRedis:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("crash-point tests need redis-server on PATH")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.directory), "--appendonly", "yes",
             "--appendfsync", "everysec", "--maxmemory-policy", "noeviction",
             "--save", "", "--logfile", str(self.directory / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        _wait(self._answers, 15, f"redis-server on port {self.port}")
        return self

    def _answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"redis-server exited: see {self.directory / 'redis.log'}")
        # A bare PING on a socket: every Redis client of relier's is built by
        # core/store/connection.py, and this server is not relier's store yet.
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        _stop(self.process, 10)


@dataclass
class CrashWorker:
    """``celery -A <app> worker`` (prefork, one pool process) through the launcher,
    recording and dying at crash points in ``directory``.

    One pool process: an incarnation's crossings are then never interleaved with
    another task's, and a task it pushes runs after it.
    """

    app: str
    directory: Path
    env: Mapping[str, str]
    process: subprocess.Popen[bytes] | None = None
    hostname: str = field(default_factory=lambda: f"crash-{uuid.uuid4().hex[:8]}@relier")
    _log: IO[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.directory / "worker.log"

    def log_text(self) -> str:
        try:
            return self.log_path.read_bytes().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def start(self, timeout_s: float = 60) -> CrashWorker:
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [
            sys.executable, "-m", "relier_django.crashpoints.launch", str(self.directory),
            "-A", self.app, "worker", "--pool", "prefork", "--concurrency", "1",
            "--hostname", self.hostname, "--loglevel", "INFO",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the worker
        self.process = subprocess.Popen(
            args, env={**os.environ, **self.env}, stdout=self._log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        _wait(self._ready, timeout_s, f"the crash-testing worker {self.hostname}")
        return self

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"the crash-testing worker exited:\n{self.log_text()[-4000:]}")
        return f"{self.hostname} ready." in self.log_text()

    def stop(self) -> None:
        _stop(self.process, 30)
        if self._log is not None:
            self._log.close()
