"""Private servers and real Celery workers, started and stopped by PID.

Used by the test suite, the chaos runner, the benchmarks and ``make demo``. Nothing
here ever touches a server it did not start: every Redis gets a free port and a
directory of its own, every worker runs in its own process group, and only those
PIDs are ever signalled.
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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import redis

REPO_ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate, timeout_s: float, interval_s: float = 0.05, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value; raise TimeoutError otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.1f}s waiting for {what}")
        time.sleep(interval_s)


@dataclass
class RedisServer:
    """A private ``redis-server``: AOF on (everysec), ``noeviction``, no RDB snapshots.

    ``restart()`` kills it with SIGKILL and starts it again on the same port and
    directory, so it reloads from its append-only file as a crashed server would.
    """

    directory: Path
    port: int = field(default_factory=free_port)
    extra_args: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self.process is not None, "redis-server is not running"
        return self.process.pid

    def args(self) -> list[str]:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not on PATH: run ./scripts/bootstrap.sh")
        return [
            binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--maxmemory-policy", "noeviction",
            "--save", "",
            "--daemonize", "no",
            "--logfile", str(self.directory / "redis.log"),
            *self.extra_args,
        ]  # fmt: skip

    def start(self) -> RedisServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            self.args(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        wait_until(self._ready, 15, what=f"redis-server on port {self.port}")
        return self

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            err = self.process.stderr.read().decode() if self.process.stderr else ""
            log = self.directory / "redis.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"redis-server exited with {self.process.returncode}: {err}{tail}")
        try:
            client = self.client()
            ok = bool(client.ping()) and client.info("persistence").get("loading") == 0
            client.close()
            return ok
        except redis.exceptions.BusyLoadingError:
            return False
        except redis.exceptions.ConnectionError:
            return False

    def client(self, **kwargs) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, **kwargs)

    def kill(self) -> None:
        """SIGKILL, as a crash would: nothing is flushed beyond what AOF everysec has."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def restart(self, down_s: float = 0.0) -> None:
        self.kill()
        if down_s:
            time.sleep(down_s)
        self.start()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        if self.process.stderr:
            self.process.stderr.close()


def worker_env(redis_url: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a testproject process needs to use the private Redis."""
    env = dict(os.environ)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "testproject.settings",
            "RELIER_REDIS_URL": redis_url,
            "CELERY_BROKER_URL": redis_url,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])),
            "PYTHONUNBUFFERED": "1",
        }
    )
    if extra:
        env.update(extra)
    return env


@dataclass
class CeleryWorker:
    """A real ``celery -A testproject worker`` (prefork) in its own process group."""

    redis_url: str
    log_dir: Path
    name: str = "w1"
    concurrency: int = 2
    queues: tuple[str, ...] = ()
    extra_env: Mapping[str, str] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"worker-{self.name}.log"

    @property
    def hostname(self) -> str:
        return f"{self.name}@relier-test"

    @property
    def pid(self) -> int:
        assert self.process is not None, "worker is not running"
        return self.process.pid

    def start(self, wait: bool = True, timeout_s: float = 60) -> CeleryWorker:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        args = [
            sys.executable, "-m", "celery", "-A", "testproject", "worker",
            "--pool", "prefork",
            "--concurrency", str(self.concurrency),
            "--hostname", self.hostname,
            "--loglevel", "INFO",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            *(["--queues", ",".join(self.queues)] if self.queues else []),
            *self.extra_args,
        ]  # fmt: skip
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the worker
        self._log_start = self.log_path.stat().st_size
        self.process = subprocess.Popen(
            args,
            cwd=REPO_ROOT,
            env=worker_env(self.redis_url, self.extra_env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: killpg reaches only it
        )
        if wait:
            self.wait_ready(timeout_s)
        return self

    def log_text(self) -> str:
        with open(self.log_path, "rb") as fh:
            fh.seek(self._log_start)
            return fh.read().decode(errors="replace")

    def wait_ready(self, timeout_s: float = 60) -> None:
        def ready() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited early:\n{self.log_text()[-4000:]}")
            # Celery logs "<hostname> ready." once the consumer is up and the pool has started.
            return f"{self.hostname} ready." in self.log_text() and len(self.children()) >= min(
                1, self.concurrency
            )

        wait_until(ready, timeout_s, interval_s=0.1, what=f"worker {self.name} to be ready")

    def children(self) -> list[psutil.Process]:
        """The prefork pool processes (direct children of the main process)."""
        if self.process is None or self.process.poll() is not None:
            return []
        try:
            return psutil.Process(self.process.pid).children()
        except psutil.NoSuchProcess:
            return []

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _group_signal(self, sig: int) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)

    def kill_child(self, pid: int | None = None) -> int:
        """SIGKILL one pool process (the given one, or the first); returns its PID."""
        target = pid if pid is not None else self.children()[0].pid
        os.kill(target, signal.SIGKILL)
        return target

    def kill(self) -> None:
        """SIGKILL the whole worker: main process and every child, at once."""
        self._group_signal(signal.SIGKILL)
        self._reap()

    def stop_group(self) -> None:
        """SIGSTOP the whole worker (a paused VM, a long GC, a stuck host)."""
        self._group_signal(signal.SIGSTOP)

    def cont_group(self) -> None:
        self._group_signal(signal.SIGCONT)

    def terminate(self, wait_s: float | None = 60) -> None:
        """SIGTERM the main process only, as Docker and Kubernetes do: a warm shutdown."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        if wait_s is not None:
            try:
                self.process.wait(wait_s)
            except subprocess.TimeoutExpired:
                self.kill()
            self._reap()

    def _reap(self) -> None:
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
            # Pool children that outlived their parent are still ours: stop them too.
            self._group_signal(signal.SIGKILL)
        if (
            getattr(self, "_log", None) is not None
            and self.process
            and self.process.poll() is not None
        ):
            self._log.close()

    def stop(self) -> None:
        """Warm shutdown with a deadline, then SIGKILL whatever is left of the group."""
        if self.alive():
            self.cont_group()
            self.terminate(wait_s=30)
        self._group_signal(signal.SIGKILL)
        self._reap()


@contextlib.contextmanager
def redis_server(directory: Path, **kwargs) -> Iterator[RedisServer]:
    server = RedisServer(directory=directory, **kwargs).start()
    try:
        yield server
    finally:
        server.stop()
