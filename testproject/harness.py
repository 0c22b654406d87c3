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
from typing import Any, ClassVar
from urllib.parse import quote

import psutil
import redis

# free_port and stop_process live in servers.py; the suite imports them from here too.
from testproject.servers import PrivateServer, free_port, stop_process

REPO_ROOT = Path(__file__).resolve().parent.parent


# A Redis Cluster node listens on its port and, for the cluster bus, on port + 10000;
# it refuses to start above 55535.
CLUSTER_BUS_OFFSET = 10_000


def free_cluster_port() -> int:
    """A free port for a Redis Cluster node: at most 55535, its bus port free too."""
    while True:
        port = free_port()
        if port + CLUSTER_BUS_OFFSET > 65535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port + CLUSTER_BUS_OFFSET))
            except OSError:
                continue
        return port


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


@dataclass(frozen=True)
class TlsFiles:
    """A throw-away certificate authority and the certificates it signed (PEM files)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_tls_files(directory: Path) -> TlsFiles:
    """Generate a self-signed CA, a server certificate for 127.0.0.1/localhost and a
    client certificate, with ``openssl``, in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(*(directory / n for n in ("ca.crt", "server.crt", "server.key",
                                               "client.crt", "client.key")))  # fmt: skip

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", "ca.key", "-out", str(files.ca), "-subj", "/CN=relier-test-ca")  # fmt: skip
    for name, cert, key, extra in (
        ("server", files.server_cert, files.server_key,
         "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth"),
        ("client", files.client_cert, files.client_key, "extendedKeyUsage=clientAuth"),
    ):  # fmt: skip
        (directory / f"{name}.ext").write_text(extra + "\n")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                "-out", f"{name}.csr", "-subj", f"/CN=relier-test-{name}")  # fmt: skip
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", str(files.ca), "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-out", str(cert),
                "-extfile", f"{name}.ext")  # fmt: skip
    return files


@dataclass
class RedisServer(PrivateServer):
    """A private ``redis-server``: AOF on (everysec), ``noeviction``, no RDB snapshots.

    ``restart()`` kills it with SIGKILL and starts it again on the same port and
    directory, so it reloads from its append-only file as a crashed server would.
    With ``password`` it requires AUTH; with ``tls`` it listens on TLS only (``port``
    is then its TLS port, and ``url`` a ``rediss://`` URL trusting ``tls.ca``). Its
    directory is kept after ``stop()``: a restart reloads it. The Redis Cluster's
    nodes (testproject/cluster.py) are these servers too.
    """

    program: ClassVar[str] = "redis-server"
    log_name: ClassVar[str] = "redis.log"

    directory: Path
    port: int = field(default_factory=free_port)
    extra_args: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = None
    password: str | None = None
    tls: TlsFiles | None = None

    @property
    def url(self) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        if self.tls is None:
            return f"redis://{auth}127.0.0.1:{self.port}/0"
        return f"rediss://{auth}127.0.0.1:{self.port}/0?ssl_ca_certs={quote(str(self.tls.ca))}"

    def args(self) -> list[str]:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not on PATH: run ./scripts/bootstrap.sh")
        listen = ["--port", str(self.port)]
        if self.tls is not None:
            listen = [
                "--port", "0", "--tls-port", str(self.port),
                "--tls-cert-file", str(self.tls.server_cert),
                "--tls-key-file", str(self.tls.server_key),
                "--tls-ca-cert-file", str(self.tls.ca),
                "--tls-auth-clients", "no",  # extra_args may say "yes"; the last one wins
                "--tls-replication", "yes",
            ]  # fmt: skip
        auth = ["--requirepass", self.password, "--masterauth", self.password]
        return [
            binary,
            *listen,
            *(auth if self.password else []),
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
        self._wait_ready(15)
        return self

    def log_tail(self, chars: int = 2000) -> str:
        # A bad argument is refused on stderr, before the log file is opened.
        process = self.process
        err = b""
        if process is not None and process.poll() is not None and process.stderr:
            err = process.stderr.read()
        return err.decode(errors="replace") + super().log_tail(chars)

    def _answers(self) -> bool:
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
        """A new client straight to this server (its password and TLS CA applied)."""
        if self.password:
            kwargs.setdefault("password", self.password)
        if self.tls is not None:  # the client certificate too, for --tls-auth-clients yes
            kwargs.setdefault("ssl", True)
            kwargs.setdefault("ssl_ca_certs", str(self.tls.ca))
            kwargs.setdefault("ssl_certfile", str(self.tls.client_cert))
            kwargs.setdefault("ssl_keyfile", str(self.tls.client_key))
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
        stop_process(self.process)  # the directory stays: it is the caller's


# relier's clients retry a connection error for REDIS_RETRY_S (3.75 s, up to twice that)
# before they raise. A test of what an unreachable Redis is answered with (a page, a
# command, a push, a worker's start) gives this to the process under test, so that it
# answers at the first refusal instead of waiting the budget out at every call; the
# tests of the budget itself (riding out a restart, giving up only after it) do not.
QUICK_REDIS_RETRY_ENV: dict[str, str] = {"RELIER_REDIS_RETRY_S": "0"}


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


def reset_celery_connections(app: Any) -> None:
    """Drop ``app``'s broker connections; Celery rebuilds its pools lazily.

    Celery's pools live in kombu's global registry (keyed by broker URL), so closing
    one is not enough: a later pool for the same URL would be the closed one
    ("Acquire on closed pool"). ``kombu.pools.reset()`` closes and forgets them all.
    """
    import kombu.pools

    kombu.pools.reset()
    app._pool = None
    app.amqp._producer_pool = None
    # The queues (and the router that reads them) are built once from the conf of the
    # moment: rebuilt from the conf now in force (a queue type, a default queue).
    for cached in ("queues", "router"):
        vars(app.amqp).pop(cached, None)


@contextlib.contextmanager
def process_pointed_at(env: Mapping[str, str], **celery_conf: Any) -> Iterator[None]:
    """Make this process's relier config and Celery app follow ``env`` (the
    ``RELIER_*`` and ``CELERY_BROKER_URL`` variables a worker would be given) and the
    Celery settings in ``celery_conf``; restore everything on exit.

    For a test that pushes to servers other than the session's private Redis.
    """
    from relier_django import conf
    from testproject.celery import app

    saved_env = {name: os.environ.get(name) for name in env}
    from testproject.settings import broker_transport

    saved_conf = {name: app.conf[name] for name in ("broker_url", "broker_transport", *celery_conf)}
    os.environ.update(env)
    url = env.get("CELERY_BROKER_URL", app.conf.broker_url)
    app.conf.update({"broker_url": url, "broker_transport": broker_transport(url), **celery_conf})
    conf.get_config.cache_clear()
    reset_celery_connections(app)
    try:
        yield
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        app.conf.update(saved_conf)
        conf.get_config.cache_clear()
        reset_celery_connections(app)


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
    # Another checkout's code (a benchmark's "before"): the worker runs from there.
    cwd: Path | None = None
    # A cgroup's process list (``.../cgroup.procs``): the worker starts inside it, so
    # its pool processes and its own reading of /proc/self/cgroup are the cgroup's.
    cgroup_procs: Path | None = None

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
        if self.cgroup_procs is not None:
            # The shell joins the cgroup, then becomes the worker (exec keeps its PID).
            args = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.cgroup_procs), *args]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the worker
        self._log_start = self.log_path.stat().st_size
        self.process = subprocess.Popen(
            args,
            cwd=self.cwd or REPO_ROOT,
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


@dataclass
class SentinelServer:
    """A private Redis Sentinel (``redis-server <conf> --sentinel``) watching one master.

    Sentinel rewrites its config file as it learns, so each one gets a directory of
    its own. Timings default to chaos-test speed: a master that does not answer for
    ``down_after_ms`` is down, and a stalled failover is retried after twice
    ``failover_timeout_ms``.
    """

    directory: Path
    master_name: str
    master_port: int
    quorum: int = 2
    down_after_ms: int = 1000
    failover_timeout_ms: int = 5000
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    password: str | None = None  # the sentinel's own requirepass
    master_password: str | None = None  # what it authenticates to the master with
    tls: TlsFiles | None = None  # TLS only, to its clients and to the master

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _tls_conf(self) -> str:
        if self.tls is None:
            return f"port {self.port}\n"
        return (
            f"port 0\ntls-port {self.port}\ntls-cert-file {self.tls.server_cert}\n"
            f"tls-key-file {self.tls.server_key}\ntls-ca-cert-file {self.tls.ca}\n"
            # The client side of its links to the master and replicas: the same files.
            "tls-auth-clients no\ntls-replication yes\n"
        )

    def start(self) -> SentinelServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not on PATH: run ./scripts/bootstrap.sh")
        self.directory.mkdir(parents=True, exist_ok=True)
        conf = self.directory / "sentinel.conf"
        name = self.master_name
        conf.write_text(
            f"{self._tls_conf()}bind 127.0.0.1\ndir {self.directory}\n"
            f"logfile {self.directory / 'sentinel.log'}\n"
            f"sentinel monitor {name} 127.0.0.1 {self.master_port} {self.quorum}\n"
            f"sentinel down-after-milliseconds {name} {self.down_after_ms}\n"
            f"sentinel failover-timeout {name} {self.failover_timeout_ms}\n"
            f"sentinel parallel-syncs {name} 1\n"
            + (
                f"sentinel auth-pass {name} {self.master_password}\n"
                if self.master_password
                else ""
            )
            + (f"requirepass {self.password}\n" if self.password else "")
        )
        self.process = subprocess.Popen(
            [binary, str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        wait_until(self._ready, 15, what=f"redis sentinel on port {self.port}")
        return self

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            err = self.process.stderr.read().decode() if self.process.stderr else ""
            raise RuntimeError(f"redis sentinel exited with {self.process.returncode}: {err}")
        try:
            with self.client() as client:
                return bool(client.ping())
        except redis.exceptions.ConnectionError:
            return False

    def client(self) -> redis.Redis:
        tls = {"ssl": True, "ssl_ca_certs": str(self.tls.ca)} if self.tls else {}
        return redis.Redis(
            host="127.0.0.1",
            port=self.port,
            password=self.password,
            socket_timeout=5,
            decode_responses=True,
            **tls,
        )

    def master_state(self) -> dict:
        """``SENTINEL MASTER <name>`` as this sentinel sees it."""
        with self.client() as client:
            return client.sentinel_master(self.master_name)

    def master_port_seen(self) -> int:
        with self.client() as client:
            return int(client.sentinel_get_master_addr_by_name(self.master_name)[1])

    def stop(self) -> None:
        stop_process(self.process)


@dataclass
class SentinelGroup:
    """A master, its replica and three sentinels (quorum 2) on loopback, each with a
    directory of its own, stopped by PID.

    ``start()`` returns once the replica is in sync and every sentinel knows the
    replica and the two other sentinels, so a failover can be elected at once.
    """

    directory: Path
    master_name: str = "relier-master"
    down_after_ms: int = 1000
    failover_timeout_ms: int = 5000
    servers: list[RedisServer] = field(default_factory=list)
    sentinels: list[SentinelServer] = field(default_factory=list)

    def start(self) -> SentinelGroup:
        # Each process is recorded as soon as it runs, so stop() reaches it even if a
        # later step fails.
        master = RedisServer(directory=self.directory / "redis-a")
        self.servers.append(master)
        master.start()
        replica = RedisServer(
            directory=self.directory / "redis-b",
            extra_args=("--replicaof", "127.0.0.1", str(master.port)),
        )
        self.servers.append(replica)
        replica.start()

        def in_sync() -> bool:
            with replica.client() as client:
                return client.info("replication").get("master_link_status") == "up"

        wait_until(in_sync, 15, what="the replica to sync")
        for i in range(3):
            sentinel = SentinelServer(
                directory=self.directory / f"sentinel-{i}",
                master_name=self.master_name,
                master_port=master.port,
                down_after_ms=self.down_after_ms,
                failover_timeout_ms=self.failover_timeout_ms,
            )
            self.sentinels.append(sentinel)
            sentinel.start()

        def everyone_known() -> bool:
            states = [s.master_state() for s in self.sentinels]
            return all(
                int(st["num-slaves"]) == 1 and int(st["num-other-sentinels"]) == 2 for st in states
            )

        # Sentinels find each other through hello messages on the master (every 2 s).
        wait_until(everyone_known, 30, interval_s=0.2, what="the sentinels to find each other")
        return self

    @property
    def sentinel_addresses(self) -> str:
        """Comma-separated, as ``RELIER_SENTINELS`` takes them."""
        return ",".join(s.address for s in self.sentinels)

    @property
    def broker_url(self) -> str:
        """Kombu's Sentinel broker URL (one ``sentinel://`` per sentinel, ``;``-joined)."""
        return ";".join(f"sentinel://{s.address}/0" for s in self.sentinels)

    @property
    def redis_url(self) -> str:
        """The ``REDIS_URL`` relier needs beside the sentinels: db 0 (host ignored)."""
        return "redis://127.0.0.1/0"

    def env(self) -> dict[str, str]:
        """What a testproject process (worker, command) needs to use this group."""
        return {
            "RELIER_REDIS_URL": self.redis_url,
            "RELIER_SENTINELS": self.sentinel_addresses,
            "RELIER_SENTINEL_MASTER": self.master_name,
            "CELERY_BROKER_URL": self.broker_url,
            "CELERY_BROKER_MASTER_NAME": self.master_name,
        }

    def master(self) -> RedisServer:
        """The server the sentinels currently agree is the master."""
        ports = {s.master_port_seen() for s in self.sentinels if s.process is not None}
        if len(ports) != 1:
            raise RuntimeError(f"the sentinels disagree on the master: ports {sorted(ports)}")
        (port,) = ports
        return next(server for server in self.servers if server.port == port)

    def kill_master_when_replicated(self) -> RedisServer:
        """SIGKILL the master at an instant when its replica holds every write it acked;
        returns the killed server.

        Replication is asynchronous, so a master killed at a random instant may take
        its last acknowledged writes with it (docs/operations.md, the replication
        window). Here CLIENT PAUSE WRITE holds every client's next write (they wait,
        they are not refused), the replica catches up to the master's replication
        offset, and the master dies with the held writes unexecuted: their clients'
        retries carry them to the new master.
        """
        master = self.master()
        replica = next(server for server in self.servers if server is not master)
        with master.client(decode_responses=True) as client:
            client.client_pause(30_000, all=False)
            target = client.info("replication")["master_repl_offset"]

        def caught_up() -> bool:
            with replica.client(decode_responses=True) as client:
                return client.info("replication")["slave_repl_offset"] >= target

        wait_until(caught_up, 10, interval_s=0.01, what="the replica to catch up")
        master.kill()
        return master

    def wait_for_failover(self, old: RedisServer, timeout_s: float = 30) -> RedisServer:
        """Until every sentinel names another server as master, and it accepts writes."""

        def promoted() -> RedisServer | None:
            ports = {s.master_port_seen() for s in self.sentinels}
            if len(ports) != 1 or old.port in ports:
                return None
            new = next(server for server in self.servers if server.port in ports)
            with new.client() as client:
                return new if client.info("replication").get("role") == "master" else None

        return wait_until(promoted, timeout_s, interval_s=0.1, what="the sentinels to fail over")

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in self.servers:
            server.stop()


@contextlib.contextmanager
def sentinel_group(directory: Path, **kwargs) -> Iterator[SentinelGroup]:
    group = SentinelGroup(directory=directory, **kwargs)
    try:
        yield group.start()
    finally:
        group.stop()
